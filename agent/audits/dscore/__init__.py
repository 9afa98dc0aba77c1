"""D-Score: robustness and fitness of a CNN from region deletion and pad-and-resize translation.

Implements §IV of the D-Score paper ("D-Score: a white-box diagnosis score for CNNs based on
mutation operators"), see ``docs``/papers ``d-score.txt``:

* **Variants (§IV-A "Mutation Operators", §V-B "Deleting Mutation Operator").** The output of every
  2-D ``Conv`` node is split into an ``n × n`` grid of equal rectangles, indexed row-major from the
  upper-left corner; variant ``i`` sets region ``i`` of *every* convolution output to 0 during the
  forward pass. Here this is graph surgery: after each ``Conv`` a ``Mul(conv_out, mask_k)`` is
  inserted, where ``mask_k`` is a new graph input of shape ``[1, 1, H_k, W_k]`` (broadcast over batch
  and channels). One onnxruntime session therefore evaluates the base model (all-ones masks, which
  reproduce the original outputs bit for bit) and all ``n²`` variants (region-zeroed masks).
  Region boundaries on an ``H × W`` map are ``floor(i·H/n)``.
* **Translation (§IV-A "Image Transformation", Fig. 4).** For the region at row ``r``, column ``c``
  the image is padded with zeros: ``r·u_h`` rows on top, ``(n−1−r)·u_h`` at the bottom, ``c·u_w``
  columns left and ``(n−1−c)·u_w`` right, with ``u_h = round(H/t)``, ``u_w = round(W/t)`` (half up),
  then resized back to ``H × W`` by bilinear interpolation (half-pixel centres, no antialiasing).
  The paper's example (``n = 4``, region 7, 1-based) pads ``l/t`` top, ``2l/t`` bottom, ``2k/t`` left,
  ``k/t`` right: paddings are whole multiples of one rounded unit, so we round the unit once and
  multiply, which keeps the paper's 1:2 proportions exact.
* **Scores.** Feature distribution f̃ (eq. 1), attention distribution ã (eq. 2), v_fitness (eq. 3),
  v_robust (eq. 4), the bound g(n) (eq. 5), D-Score (eq. 6), augmentation probability p and padded
  size d (eq. 7) and the random split of the padding (eq. 8, :func:`.translation.augment`).

Region indices in this package are 0-based (``0 … n²−1``); the paper counts from 1.

Modules: :mod:`.scores` (eqs. 1-7), :mod:`.translation` (regions, translation, eq. 8),
:mod:`.masking` (graph surgery after every ``Conv``), :mod:`.run` (the audit and its heatmaps).
"""

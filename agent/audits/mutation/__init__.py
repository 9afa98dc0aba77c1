"""Data-mutation robustness: the DEC, IMP, SGN and DIG operators and the audits built on them.

Implements §4 of Méndez, Benito-Parejo and Merayo, "Testing the Robustness of Machine Learning
Models Through Mutations" (ICCCI 2024), with the robustness measure of §3/§5: the relative change
(in %) of MAE and MSE — here also RMSE — of the model before vs after mutating the data, averaged
over repetitions with its standard deviation.

Operators (on one value ``x`` of a numeric cell; ``α``/``β`` are the lengths of the whole and the
fractional part of ``|x|`` in its shortest decimal representation, e.g. 18.27 → α = 2, β = 2, and
0.23 → α = 1 (the whole part "0"), β = 2):

* **DEC** (misplaced or omitted decimal point): ``x' = x·10^e`` with ``e`` drawn uniformly from the
  integers ``−(α−1) ≤ e ≤ β``, ``e ≠ 0``; only for numbers with a decimal part (β ≥ 1). 18.27 can
  become 1.827, 182.7 or 1827; a number with ``|x| > 1`` never drops below 1.
* **IMP** (imputed missing value): ``x'`` drawn uniformly from ``0``, the previous value of the same
  column ``x_{i−1,j}``, and the mean of all previous values of the column; the first row has only 0.
* **SGN** (sign error): ``x' = −x``.
* **DIG** (wrong digit in the whole part): a position ``1 ≤ s ≤ α`` (``d_1`` least significant) and a
  digit ``m ≠ d_s`` are drawn uniformly; ``x' = x − d_s·10^{s−1} + m·10^{s−1}`` for ``x ≥ 0`` and
  ``x' = x + d_s·10^{s−1} − m·10^{s−1}`` for ``x < 0``. (The paper prints the negative case as
  ``−x + d_s·10^{s−1} − m·10^{s−1}``, which would flip the sign; we keep the sign, as the text
  intends: the digit of ``|x|`` is replaced.)

An operator that cannot apply to a value (DEC on a whole number, SGN on 0, any operator on NaN/inf,
IMP whose drawn value equals the original — the "no change" cases of §5) raises
:class:`.operators.NotApplicable`; :func:`.operators.mutate` logs such cells and does not count them as mutations.

Probabilistic errors of a classifier follow BenchMetrics Prob (the robust instruments MAE, MSE,
RMSE; never LogLoss, MAPE or median variants): the mean over all ``N × K`` entries of
``|p − onehot(y)|`` (MAE) and ``(p − onehot(y))²`` (MSE), RMSE = sqrt(MSE). For two classes these
equal the binary definitions on the positive-class score.

Modules: :mod:`.operators` (the operators and :func:`.operators.mutate`), :mod:`.robustness`
(errors and their relative change), :mod:`.run` (audit of a deployed classifier), :mod:`.retrain`
(mutate the training set and retrain).
"""

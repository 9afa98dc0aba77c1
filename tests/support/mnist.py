"""The bundle the suite shares: the shipped MNIST CNN fitted once per run (conftest's
``mnist_bundle_dir``), with an IDI rule on a ``form`` metadata field (the ICOS paper's example)."""

from __future__ import annotations

from pathlib import Path

from agent.data.datasets import Splits
from agent.model.classifier import OnnxClassifier

#: IDI rules written into the shared bundle: ``form == lines`` allows only the digits 1, 4 and 7.
MNIST_IDI_YAML = """\
rules:
  - name: lines-only
    when: {field: form, equals: lines}
    allowed_labels: [1, 4, 7]
"""


def fit_mnist_bundle(root: Path, model: OnnxClassifier, splits: Splits, n_estimators: int = 30) -> Path:
    """Fit a bundle for ``model`` on ``splits`` (train and validation) into ``root/bundle``."""
    from agent.data.files import Dataset
    from agent.offline.fit import fit_bundle
    from invariants.fit_params import FitParams

    idi = root / "idi.yaml"
    idi.write_text(MNIST_IDI_YAML)
    report = fit_bundle(
        model,
        Dataset(splits.train.x, splits.train.y),
        Dataset(splits.val.x, splits.val.y),
        idi_path=idi,
        params=FitParams(n_estimators=n_estimators),
    )
    out = root / "bundle"
    report.bundle.save(out)
    return out

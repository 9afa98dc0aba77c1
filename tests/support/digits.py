"""A second model beside the MNIST CNN: a logistic regression on scikit-learn's 8x8 digits (64 float
features, 10 classes), exported by skl2onnx, and its bundle; made once per run (conftest's
``digits_logreg``) for the tests that serve it as a process, behind MLServer or in a fleet."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The model's name in the bundle and in the agents' settings.
MODEL = "digits"


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: 1,797 rows of 64 float32 pixels (0..16) and their labels."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x.astype(np.float32), y


def fit_digits_logreg(root: Path) -> dict[str, str]:
    """Train on rows 0..899 (the same model MLServer trains for the proxy tests), export it to
    ``root/digits.onnx`` and fit its bundle (20 trees; validation rows 900..1399) into ``root/bundle``."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    from agent.data.files import Dataset
    from agent.model.classifier import OnnxClassifier
    from agent.offline.fit import fit_bundle
    from invariants.fit_params import FitParams

    x, y = digits()
    clf = LogisticRegression(max_iter=2000).fit(x[:900], y[:900])
    exported = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (root / "digits.onnx").write_bytes(exported.SerializeToString())
    model = OnnxClassifier.load(root / "digits.onnx", name=MODEL)
    report = fit_bundle(
        model, Dataset(x[:900], y[:900]), Dataset(x[900:1400], y[900:1400]), params=FitParams(n_estimators=20)
    )
    report.bundle.save(root / "bundle")
    return {"model": str(root / "digits.onnx"), "bundle": str(root / "bundle")}

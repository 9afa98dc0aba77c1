"""The demo: fit (or load) the invariants of the shipped MNIST CNN, then compare every estimator with the
true accuracy on an in-distribution set and on shifted sets built from the MNIST-5k test split."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from agent.data_io import Dataset
from agent.datasets import mnist_splits
from agent.model import OnnxClassifier, default_model_path
from agent.offline import HEADLINE_ESTIMATOR, check_report, fit_bundle
from invariants.bundle import Bundle, BundleError


def _translate(x: np.ndarray, dx: int, dy: int) -> np.ndarray:
    out = np.zeros_like(x)
    h, w = x.shape[-2:]
    out[..., max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = x[
        ..., max(-dy, 0) : h + min(-dy, 0), max(-dx, 0) : w + min(-dx, 0)
    ]
    return out


def _noise(sigma: float, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    def apply(x: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return np.clip(x + rng.normal(0.0, sigma, x.shape), 0, 255).astype(np.float32)

    return apply


def phases(seed: int) -> list[tuple[str, Callable[[np.ndarray], np.ndarray]]]:
    return [
        ("in distribution", lambda x: x),
        ("translated 2 px", lambda x: _translate(x, 2, 2)),
        ("translated 4 px", lambda x: _translate(x, 4, 3)),
        ("gaussian noise σ=60", _noise(60.0, seed)),
        ("gaussian noise σ=110", _noise(110.0, seed + 1)),
    ]


def load_or_fit(model: OnnxClassifier, state_dir: Path, refit: bool, seed: int) -> Bundle:
    bundle_dir = state_dir / "bundle"
    if not refit and (bundle_dir / "manifest.json").exists():
        try:
            return Bundle.load(bundle_dir, expected_model_sha256=model.sha256)
        except BundleError as exc:
            print(f"existing bundle not usable ({exc}); fitting again", file=sys.stderr)
    splits = mnist_splits()
    print("fitting invariants on MNIST-5k (train 2,500 for TDI, validation 1,500 for ADI + calibration) ...")
    t0 = time.perf_counter()
    report = fit_bundle(
        model,
        Dataset(splits.train.x, splits.train.y),
        Dataset(splits.val.x, splits.val.y),
        seed=seed,
        progress=lambda m: print(f"  {m}"),
    )
    report.bundle.save(bundle_dir)
    cal = report.bundle.calibration
    print(
        f"  done in {time.perf_counter() - t0:.1f} s: {report.n_selected}/{report.n_rules} TDI rules selected, "
        f"oracle TPR {cal.tpr:.2f} / FPR {cal.fpr:.3f} on {cal.n} calibration samples"
    )
    return report.bundle


def run_demo(state_dir: str | Path = "icos-state", refit: bool = False, seed: int = 0) -> int:
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    model = OnnxClassifier.load(default_model_path(), name="mnist-cnn")
    print(f"model: {default_model_path().name} (sha256 {model.sha256[:12]}…), input {list(model.input_shape)}")
    bundle = load_or_fit(model, state, refit, seed)
    test = mnist_splits().test
    rows = []
    for name, shift in phases(seed):
        report = check_report(model, bundle, Dataset(shift(test.x), test.y))
        rows.append((name, report))
    names = list(rows[0][1]["estimates"])
    head = f"{'operational set':<22}{'truth':>7}  " + "".join(f"{n:>18}" for n in names)
    print()
    print(head)
    print("-" * len(head))
    for name, rep in rows:
        cells = ""
        for n in names:
            e = rep["estimates"][n]
            cells += f"{e['value']:.3f} ±{(e['upper'] - e['lower']) / 2:.3f}".rjust(18)
        print(f"{name:<22}{rep['truth']['accuracy']:>7.3f}  {cells}")
    print()
    print("mean absolute error over these sets:")
    for n in names:
        mae = float(np.mean([rep["abs_error"][n] for _, rep in rows]))
        star = "  <- headline" if n == HEADLINE_ESTIMATOR else ""
        print(f"  {n:<16}{mae:.3f}{star}")
    print(f"\nbundle: {state / 'bundle'}")
    return 0

"""A champion and its challenger whose truth is known: the shipped MNIST CNN and the same recipe retrained on
drifted data (``bench/challenger/models/mnist_drift.onnx``, seeded), its bundle fitted with ``fit --champion``
through the command line, and the drifted traffic the retrained version is better on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.cli import main
from agent.data.datasets import Splits
from bench.challenger.example import drifted

__all__ = ["CHALLENGER_MODEL", "drifted", "fit_challenger_bundle"]

#: The challenger: the shipped recipe retrained on the training split plus a drifted copy of it
#: (``python -m bench.challenger.models.train mnist_drift`` rebuilds it).
CHALLENGER_MODEL = Path(__file__).resolve().parents[2] / "bench" / "challenger" / "models" / "mnist_drift.onnx"


def fit_challenger_bundle(
    root: Path, splits: Splits, champion: Path, shift_sets: int = 24, model: Path = CHALLENGER_MODEL
) -> Path:
    """``icos-agent fit --model <model> --champion <champion>`` on ``splits`` into ``root/bundle`` (few
    corrupted copies: seconds, not minutes); ``model``: the challenger (by default :data:`CHALLENGER_MODEL`)."""
    root.mkdir(parents=True, exist_ok=True)
    np.savez(root / "train.npz", x=splits.train.x, y=splits.train.y)
    np.savez(root / "val.npz", x=splits.val.x, y=splits.val.y)
    out = root / "bundle"
    argv = ["fit", "--model", str(model), "--train", str(root / "train.npz"), "--val", str(root / "val.npz")]
    argv += ["--champion", str(champion), "--trees", "30", "--shift-sets", str(shift_sets), "--out", str(out)]
    assert main([*argv, "--json"]) == 0
    return out

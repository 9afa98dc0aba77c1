"""Train the challenger models of the champion/challenger benchmark and export them to ONNX (needs torch).

Run from the repository root: ``python -m bench.challenger.models.train [NAME]``. Every model is
trained on the train split of :func:`agent.data.datasets.mnist_splits` only (validation and test
never seen), seeded, single-threaded and deterministic, so the ``.onnx`` files beside this script
are reproduced byte for byte on the same torch build:

* ``mnist_small.onnx``: a narrower LeNet (4 and 8 filters, 32 hidden), 4 epochs: the weaker version.
* ``mnist_seed2.onnx``: the shipped recipe with another seed: a version of equal accuracy.
* ``digits_mlp.onnx``: a one-hidden-layer perceptron (32 units) on scikit-learn digits, beside the
  shipped digits CNN.
* ``mnist_drift.onnx``: the shipped recipe retrained on the train split plus a drifted copy of it
  (random rotations up to 30°, Gaussian noise, fainter strokes): the version a user trains after
  seeing drifted traffic.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage
from torch import nn

from agent.data.datasets import Split, digits_splits, mnist_splits
from shipped_models_training.train_cnn import RECIPES, MnistCnn, Recipe, Scale, export, train

HERE = Path(__file__).resolve().parent


class SmallCnn(nn.Module):
    """A narrower LeNet: conv5x5(4)-relu-pool-conv5x5(8)-relu-pool-fc32-relu-fc10."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale(255.0)
        self.conv1 = nn.Conv2d(1, 4, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(4, 8, kernel_size=5)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(8 * 5 * 5, 32)
        self.fc2 = nn.Linear(32, 10)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv1(self.scale(x))))
        x = self.pool(self.relu(self.conv2(x)))
        return self.fc2(self.relu(self.fc1(torch.flatten(x, 1))))


class DigitsMlp(nn.Module):
    """flatten-fc32-relu-fc10 for 8x8 input."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale(16.0)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(torch.flatten(self.scale(x), 1))))


def drifted_copy(split: Split, seed: int) -> Split:
    """The train split as drifted traffic: rotated ±30°, Gaussian noise (σ 15% of the range), strokes
    at 60–100% intensity; one random draw per image."""
    rng = np.random.default_rng(seed)
    out = np.empty_like(split.x)
    for i, img in enumerate(split.x[:, 0]):
        r = ndimage.rotate(img, rng.uniform(-30, 30), reshape=False, order=1, mode="constant")
        r = r * rng.uniform(0.6, 1.0) + rng.normal(0, 0.15 * 255, r.shape)
        out[i, 0] = np.clip(r, 0, 255)
    return Split(out.astype(np.float32), split.y)


def main(only: str | None = None) -> int:
    shipped = next(r for r in RECIPES if r.name == "mnist_cnn")
    splits = mnist_splits()
    plain = splits.train
    both = Split(np.concatenate([plain.x, drifted_copy(plain, 7).x]), np.concatenate([plain.y, plain.y]))
    jobs: list[tuple[Recipe, Split]] = [
        (Recipe("mnist_small", "mnist_small.onnx", SmallCnn, "mnist_splits", 255.0, 4, 64, 1e-3, 1, 1234), plain),
        (replace(shipped, name="mnist_seed2", file_name="mnist_seed2.onnx", seed=2), plain),
        (replace(shipped, name="mnist_drift", file_name="mnist_drift.onnx", build=MnistCnn), both),
    ]
    digits = digits_splits()
    jobs.append(
        (Recipe("digits_mlp", "digits_mlp.onnx", DigitsMlp, "digits_splits", 16.0, 30, 16, 1e-3, 0, 1234), digits.train)
    )
    for recipe, data in jobs:
        if only is not None and recipe.name != only:
            continue
        model = train(recipe, data)
        path = HERE / recipe.file_name
        test = digits.test if recipe.splits_fn == "digits_splits" else splits.test
        export(model, recipe, data.x, path)
        with torch.no_grad():
            acc = float((model(torch.from_numpy(test.x)).argmax(1).numpy() == test.y).mean())
        print(f"{recipe.name}: test accuracy {acc:.3f}, {path.stat().st_size} bytes", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else None))

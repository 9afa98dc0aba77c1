"""Train the small CNNs shipped in ``agent/shipped_models/`` and export them to ONNX.

Run from the repository root (needs the ``train`` extra, i.e. torch)::

    pip install -e '.[train]'
    python shipped_models_training/train_cnn.py

Outputs (package data of :mod:`agent`):

* ``agent/shipped_models/mnist_cnn.onnx``: LeNet-style CNN for MNIST-5k, input ``input`` float32
  ``[N, 1, 28, 28]`` in raw pixel scale 0..255, output ``logits`` float32 ``[N, 10]``.
* ``agent/shipped_models/resnet32.onnx``: ResNet-style CNN for colour 32x32 digits
  (:func:`agent.data.datasets.colour_mnist32_splits`), input ``input`` float32 ``[N, 3, 32, 32]`` in raw
  pixel scale 0..255, output ``logits`` float32 ``[N, 10]``; the serving benchmark's heavier model.
* ``agent/shipped_models/digits_cnn.onnx``: small CNN for scikit-learn digits, input ``input`` float32
  ``[N, 1, 8, 8]`` in raw pixel scale 0..16, output ``logits`` float32 ``[N, 10]``.
* ``agent/shipped_models/models.json``: file name, sha256, input/output description, split, accuracies
  measured with onnxruntime, torch version and the regenerating command for each model.

Each model is trained only on the train split of :func:`agent.data.datasets.mnist_splits` /
:func:`agent.data.datasets.digits_splits`; the validation and test splits are never used for training
or model selection (the number of epochs is fixed). Pixel scaling is the first op of each graph
(a ``Div``), so clients send raw pixels. Every convolution is a plain ONNX ``Conv`` node followed
by ``Relu``; the graph holds no training-mode op and no softmax.

Training is seeded and runs single-threaded with deterministic algorithms, so rerunning the script
on the same torch build and CPU reproduces the same weights and the same ``.onnx`` bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from agent.data.datasets import Split, Splits, colour_mnist32_splits, digits_splits, mnist_splits  # noqa: E402
from invariants.onnx_session import OnnxSession  # noqa: E402

OUT_DIR = REPO_ROOT / "agent" / "shipped_models"
OPSET = 17
COMMAND = "python shipped_models_training/train_cnn.py"


class Scale(nn.Module):
    """Divides raw pixels by the data set's maximum pixel value.

    The divisor is a buffer, so the export is one ``Div`` of ``input`` by an initializer.
    """

    divisor: torch.Tensor

    def __init__(self, max_value: float) -> None:
        super().__init__()
        self.register_buffer("divisor", torch.tensor(float(max_value), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.divisor


class MnistCnn(nn.Module):
    """LeNet-style: conv5x5(pad 2)-relu-maxpool-conv5x5-relu-maxpool-fc-relu-fc for 28x28 input."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale(255.0)
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)  # 28x28
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)  # 14x14 -> 10x10
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.scale(x)
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc2(self.relu(self.fc1(x)))


class ResidualBlock(nn.Module):
    """conv3x3-relu-conv3x3, plus the input (a 1x1 strided conv where the shape changes), then relu."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, kernel_size=3, padding=1)
        self.shortcut = nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride) if stride != 1 or c_in != c_out else None
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.relu(self.conv1(x)))
        return self.relu(out + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet32(nn.Module):
    """ResNet-style CNN for 3x32x32 input: conv3x3(16)-relu, residual blocks 16 (32x32), 32 (16x16),
    64 (8x8), global average pool, fc10. No batch norm (the graph stays plain Conv/Relu/Add)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale(255.0)
        self.stem = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.relu = nn.ReLU()
        self.blocks = nn.Sequential(ResidualBlock(16, 16, 1), ResidualBlock(16, 32, 2), ResidualBlock(32, 64, 2))
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.stem(self.scale(x)))
        x = self.blocks(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class DigitsCnn(nn.Module):
    """conv3x3(pad 1)-relu-maxpool-conv3x3(pad 1)-relu-fc-relu-fc for 8x8 input (spatial 8 -> 4 -> 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale(16.0)
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)  # 8x8
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)  # 4x4
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.scale(x)
        x = self.pool(self.relu(self.conv1(x)))
        x = self.relu(self.conv2(x))
        x = torch.flatten(x, 1)
        return self.fc2(self.relu(self.fc1(x)))


@dataclass(frozen=True)
class Recipe:
    name: str
    file_name: str
    build: type[nn.Module]
    splits_fn: str
    pixel_max: float
    epochs: int
    batch_size: int
    lr: float
    max_shift: int
    seed: int


RECIPES = (
    Recipe("mnist_cnn", "mnist_cnn.onnx", MnistCnn, "mnist_splits", 255.0, 15, 64, 1e-3, 1, 1234),
    Recipe("digits_cnn", "digits_cnn.onnx", DigitsCnn, "digits_splits", 16.0, 40, 16, 1e-3, 1, 1234),
    Recipe("resnet32", "resnet32.onnx", ResNet32, "colour_mnist32_splits", 255.0, 12, 64, 1e-3, 1, 1234),
)


def _set_determinism(seed: int) -> None:
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def _random_shift(x: torch.Tensor, max_shift: int, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by up to ``max_shift`` pixels in each direction (zero fill)."""
    if max_shift == 0:
        return x
    n, _, h, w = x.shape
    padded = nn.functional.pad(x, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=gen)
    out = torch.empty_like(x)
    for i in range(n):
        dy, dx = int(offsets[i, 0]), int(offsets[i, 1])
        out[i] = padded[i, :, dy : dy + h, dx : dx + w]
    return out


def train(recipe: Recipe, train_split: Split) -> nn.Module:
    _set_determinism(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    model = recipe.build()
    optimiser = torch.optim.Adam(model.parameters(), lr=recipe.lr)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.from_numpy(train_split.x)
    y = torch.from_numpy(train_split.y)
    n = len(y)
    for epoch in range(recipe.epochs):
        model.train()
        order = torch.randperm(n, generator=gen)
        total = 0.0
        for start in range(0, n, recipe.batch_size):
            idx = order[start : start + recipe.batch_size]
            xb = _random_shift(x[idx], recipe.max_shift, gen)
            optimiser.zero_grad()
            loss = loss_fn(model(xb), y[idx])
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(idx)
        print(f"  {recipe.name} epoch {epoch + 1}/{recipe.epochs} loss {total / n:.4f}", flush=True)
    model.eval()
    return model


def export(model: nn.Module, recipe: Recipe, sample: np.ndarray, path: Path) -> None:
    dummy = torch.from_numpy(sample[:2])
    torch.onnx.export(
        model,
        (dummy,),
        str(path),
        dynamo=False,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
        opset_version=OPSET,
        do_constant_folding=True,
        export_params=True,
    )
    proto = onnx.load(str(path))
    proto.doc_string = (
        f"{recipe.name}: input float32 [N,{sample.shape[1]},{sample.shape[2]},{sample.shape[3]}] "
        f"raw pixels 0..{recipe.pixel_max:g}; output raw logits [N,10]. Regenerate: {COMMAND}"
    )
    onnx.checker.check_model(proto, full_check=True)
    _check_graph(proto)
    onnx.save(proto, str(path))


def _check_graph(proto: onnx.ModelProto) -> None:
    """Conv nodes are plain and each feeds a Relu; no training-mode or softmax ops; scaling comes first."""
    nodes = list(proto.graph.node)
    if nodes[0].op_type != "Div" or nodes[0].input[0] != "input":
        raise RuntimeError(f"first op must divide the input, got {nodes[0].op_type}")
    consumers: dict[str, list[str]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    for node in nodes:
        if node.op_type in {"Softmax", "LogSoftmax", "Dropout", "BatchNormalization"}:
            raise RuntimeError(f"unexpected op {node.op_type} in exported graph")
        if node.op_type == "Conv" and consumers.get(node.output[0]) not in (["Relu"], ["Add"]):
            raise RuntimeError(f"Conv {node.name} is not followed by exactly one Relu (or a residual Add)")
    (inp,) = proto.graph.input
    (out,) = proto.graph.output
    if inp.name != "input" or out.name != "logits":
        raise RuntimeError("graph input/output must be named 'input'/'logits'")


def _accuracy(session: OnnxSession, split: Split) -> tuple[float, int]:
    (logits,) = session.run({"input": split.x})
    errors = int(np.sum(np.argmax(logits, axis=1) != split.y))
    return 1.0 - errors / len(split.y), errors


def _torch_logits(model: nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def build(recipe: Recipe) -> dict[str, object]:
    splits: Splits = {
        "mnist_splits": mnist_splits,
        "digits_splits": digits_splits,
        "colour_mnist32_splits": colour_mnist32_splits,
    }[recipe.splits_fn]()
    t0 = time.perf_counter()
    model = train(recipe, splits.train)
    seconds = time.perf_counter() - t0
    path = OUT_DIR / recipe.file_name
    export(model, recipe, splits.train.x, path)

    session = OnnxSession(path)
    diff = max(
        float(np.max(np.abs(session.run({"input": split.x})[0] - _torch_logits(model, split.x))))
        for split in (splits.train, splits.val, splits.test)
    )
    if diff >= 1e-4:
        raise RuntimeError(f"onnxruntime and torch disagree on {recipe.name}: max abs diff {diff}")
    accuracies = {name: _accuracy(session, getattr(splits, name)) for name in ("train", "val", "test")}
    shape = list(splits.train.x.shape[1:])
    data = path.read_bytes()
    print(
        f"{recipe.name}: {len(data)} bytes, trained in {seconds:.1f}s, torch/onnxruntime max abs diff "
        f"{diff:.2e}, " + ", ".join(f"{k} acc {a:.4f} ({e} errors)" for k, (a, e) in accuracies.items()),
        flush=True,
    )
    return {
        "file": recipe.file_name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "input": {"name": "input", "dtype": "float32", "shape": ["N", *shape]},
        "output": {"name": "logits", "dtype": "float32", "shape": ["N", 10], "kind": "raw logits"},
        "pixel_scale": {"min": 0.0, "max": recipe.pixel_max, "scaled_inside_model": True},
        "classes": list(range(10)),
        "split": {
            "function": f"agent.data.datasets.{recipe.splits_fn}",
            "trained_on": "train",
            "sizes": {k: int(len(getattr(splits, k).y)) for k in ("train", "val", "test")},
        },
        "accuracy_onnxruntime": {k: round(a, 6) for k, (a, _) in accuracies.items()},
        "errors_onnxruntime": {k: e for k, (_, e) in accuracies.items()},
        "training": {
            "epochs": recipe.epochs,
            "batch_size": recipe.batch_size,
            "optimizer": f"Adam(lr={recipe.lr:g})",
            "augmentation": f"random shift up to {recipe.max_shift} px",
            "seed": recipe.seed,
        },
        "opset": OPSET,
        "torch_version": torch.__version__,
        "onnx_version": onnx.__version__,
        "command": COMMAND,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[r.name for r in RECIPES], help="rebuild one model only")
    args = parser.parse_args(argv)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    manifest_path = OUT_DIR / "models.json"
    manifest: dict[str, object] = {}
    if args.only and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
    for recipe in RECIPES:
        if args.only in (None, recipe.name):
            manifest[recipe.name] = build(recipe)
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {manifest_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

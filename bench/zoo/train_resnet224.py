"""Train the ``resnet224`` zoo models on synthetic shapes and export them to ONNX (needs the ``train`` extra).

Run from the repository root::

    pip install -e '.[train]'        # torch==2.13.0 (CPU)
    python -m bench.zoo.train_resnet224

Writes ``bench/zoo/models/``:

* ``resnet224.onnx``: input ``input`` float32 NCHW ``[N, 3, 224, 224]``, raw pixels 0..255 (the first ops
  compute ``(x - 127.5) / 64``); output ``logits`` float32 ``[N, 6]``; the value ``features`` ``[N, 64]`` is the pooled
  representation the last layer reads.
* ``resnet224_nhwc_uint8.onnx``: the same network behind input ``input`` uint8 NHWC ``[N, 224, 224, 3]``
  (``Cast`` and ``Transpose`` in the graph, before the same scaling).
* ``models.json``: sizes, hashes, accuracies measured with onnxruntime, training settings, this command.

Architecture: conv7×7 stride 4 (16 channels) and max-pool 2 (224 → 28, so the network is cheap), residual
blocks of two conv3×3 (16 at 28×28, 32 at 14×14, 64 at 7×7; 1×1 strided shortcuts), global average pool,
fc6; batch norm in training, folded into the convolutions by the export (the graph is Conv/Relu/Add).
Data: :func:`bench.zoo.images.generate` with a training seed no test uses; the number of epochs is fixed
(no selection on the evaluation images). Training is CPU only, seeded, single-threaded and
deterministic: the same torch build on the same machine writes the same bytes (``models.json`` included).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import nn

from bench.zoo.images import PATTERNS, generate, nchw_float
from invariants.onnx_session import OnnxSession

OUT_DIR = Path(__file__).resolve().parent / "models"
COMMAND = "python -m bench.zoo.train_resnet224"
OPSET = 17
TRAIN_SEED = 1000  # data seed of the training images
EVAL_SEED = 2000  # data seed of the images models.json reports on
EVAL_IMAGES = 600
MODEL_SEED = 1234


class Scale(nn.Module):
    """Raw pixels centred and scaled, ``(x - 127.5) / 64``: one ``Sub`` and one ``Div`` by initializers."""

    offset: torch.Tensor
    divisor: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.tensor(127.5))
        self.register_buffer("divisor", torch.tensor(64.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.offset) / self.divisor


def conv_bn(c_in: int, c_out: int, kernel: int, stride: int) -> nn.Sequential:
    """Conv and batch norm; the export folds the norm into the convolution (the graph has no BatchNorm)."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2), nn.BatchNorm2d(c_out))


class ResidualBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(c_in, c_out, 3, stride)
        self.conv2 = conv_bn(c_out, c_out, 3, 1)
        self.shortcut = conv_bn(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else None
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.relu(self.conv1(x)))
        return self.relu(out + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet224(nn.Module):
    def __init__(self, n_classes: int) -> None:
        super().__init__()
        self.scale = Scale()
        self.stem = conv_bn(3, 16, 7, 4)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.blocks = nn.Sequential(ResidualBlock(16, 16, 1), ResidualBlock(16, 32, 2), ResidualBlock(32, 64, 2))
        self.fc = nn.Linear(64, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.stem(self.scale(x))))
        x = self.blocks(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def train(x: np.ndarray, y: np.ndarray, epochs: int, batch_size: int, lr: float) -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(MODEL_SEED)
    model = ResNet224(len(PATTERNS))
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    labels = torch.from_numpy(y)
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(y), generator=gen)
        total, correct = 0.0, 0
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            xb = torch.from_numpy(nchw_float(x[idx.numpy()]))
            optimiser.zero_grad()
            logits = model(xb)
            loss = loss_fn(logits, labels[idx])
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(idx)
            correct += int((logits.argmax(1) == labels[idx]).sum())
        print(f"  epoch {epoch + 1}/{epochs} loss {total / len(y):.4f} train acc {correct / len(y):.4f}", flush=True)
    model.eval()
    return model


def _rename(proto: onnx.ModelProto, old: str, new: str) -> None:
    for node in proto.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        node.output[:] = [new if o == old else o for o in node.output]


def export_nchw(model: nn.Module, path: Path) -> onnx.ModelProto:
    dummy = torch.zeros(2, 3, 224, 224)
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
    )
    proto = onnx.load(str(path))
    ops = {n.op_type for n in proto.graph.node}
    if ops & {"BatchNormalization", "Dropout", "Softmax"}:
        raise RuntimeError(f"unexpected ops in the exported graph: {sorted(ops)}")
    (gemm,) = [n for n in proto.graph.node if n.op_type == "Gemm"]
    _rename(proto, gemm.input[0], "features")
    proto.doc_string = (
        "resnet224: input float32 NCHW [N,3,224,224] raw pixels 0..255 (centred and scaled in the graph); "
        f"output raw logits [N,6] ({', '.join(PATTERNS)}); value 'features' [N,64] is the pooled representation. "
        f"Regenerate: {COMMAND}"
    )
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))
    return proto


def nhwc_uint8_variant(nchw: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph behind a uint8 NHWC input: Cast → Transpose → the NCHW graph."""
    proto = onnx.ModelProto()
    proto.CopyFrom(nchw)
    _rename(proto, "input", "input_nchw")
    pre = [
        helper.make_node("Cast", ["input"], ["input_float"], to=TensorProto.FLOAT, name="cast_uint8"),
        helper.make_node("Transpose", ["input_float"], ["input_nchw"], perm=[0, 3, 1, 2], name="nhwc_to_nchw"),
    ]
    nodes = pre + list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    del proto.graph.input[:]
    proto.graph.input.append(helper.make_tensor_value_info("input", TensorProto.UINT8, ["N", 224, 224, 3]))
    proto.doc_string = (
        "resnet224_nhwc_uint8: input uint8 NHWC [N,224,224,3] (cast, transposed and scaled inside the graph); "
        f"output raw logits [N,6] ({', '.join(PATTERNS)}); value 'features' [N,64]. Regenerate: {COMMAND}"
    )
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _accuracy(path: Path, x: np.ndarray, y: np.ndarray, nchw: bool) -> float:
    """onnxruntime's accuracy over uint8 NHWC images, converted 64 at a time."""
    session = OnnxSession(path)
    right = 0
    for i in range(0, len(y), 64):
        feed = nchw_float(x[i : i + 64]) if nchw else x[i : i + 64]
        right += int((session.run({"input": feed})[0].argmax(1) == y[i : i + 64]).sum())
    return right / len(y)


def _check_against_torch(model: nn.Module, x_eval: np.ndarray, nchw_path: Path, nhwc_path: Path) -> None:
    with torch.no_grad():
        torch_logits = model(torch.from_numpy(nchw_float(x_eval[:64]))).numpy()
    for path, feed in ((nchw_path, nchw_float(x_eval[:64])), (nhwc_path, x_eval[:64])):
        diff = float(np.abs(OnnxSession(path).run({"input": feed})[0] - torch_logits).max())
        if diff >= 1e-3:
            raise RuntimeError(f"onnxruntime and torch disagree on {path.name}: max abs diff {diff}")


def _manifest_entry(
    path: Path,
    spec: Mapping[str, object],
    accuracy: dict[str, float],
    sizes: dict[str, int],
    args: argparse.Namespace,
) -> dict[str, object]:
    data = path.read_bytes()
    return {
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "input": {"name": "input", **spec, "pixels": "raw 0..255, scaled inside the graph"},
        "output": {"name": "logits", "dtype": "float32", "shape": ["N", len(PATTERNS)], "kind": "raw logits"},
        "penultimate": {"name": "features", "shape": ["N", 64]},
        "classes": list(PATTERNS),
        "data": {
            "generator": "bench.zoo.images.generate",
            "train": {"seed": TRAIN_SEED, "images": sizes["train"]},
            "eval": {"seed": EVAL_SEED, "images": sizes["eval"]},
        },
        "accuracy_onnxruntime": accuracy,
        "training": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "optimizer": f"Adam(lr={args.lr:g})",
            "seed": MODEL_SEED,
        },
        "opset": OPSET,
        "torch_version": torch.__version__,
        "onnx_version": onnx.__version__,
        "command": COMMAND,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-images", type=int, default=3600)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args(argv)
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    x, y = generate(args.train_images, TRAIN_SEED)
    x_eval, y_eval = generate(EVAL_IMAGES, EVAL_SEED)
    print(f"generated {len(y)} + {len(y_eval)} images in {time.perf_counter() - t0:.1f}s", flush=True)
    t0 = time.perf_counter()
    model = train(x, y, args.epochs, args.batch_size, args.lr)
    seconds = time.perf_counter() - t0

    nchw_path, nhwc_path = OUT_DIR / "resnet224.onnx", OUT_DIR / "resnet224_nhwc_uint8.onnx"
    nchw = export_nchw(model, nchw_path)
    onnx.save(nhwc_uint8_variant(nchw), str(nhwc_path))
    _check_against_torch(model, x_eval, nchw_path, nhwc_path)

    manifest = {}
    for path, nchw_input, spec in (
        (nchw_path, True, {"dtype": "float32", "layout": "NCHW", "shape": ["N", 3, 224, 224]}),
        (nhwc_path, False, {"dtype": "uint8", "layout": "NHWC", "shape": ["N", 224, 224, 3]}),
    ):
        accuracy = {
            "train": round(_accuracy(path, x, y, nchw_input), 4),
            "eval": round(_accuracy(path, x_eval, y_eval, nchw_input), 4),
        }
        sizes = {"train": len(y), "eval": len(y_eval)}
        manifest[path.stem] = _manifest_entry(path, spec, accuracy, sizes, args)
        print(f"{path.name}: {path.stat().st_size} bytes, accuracy {accuracy}", flush=True)
    (OUT_DIR / "models.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"trained in {seconds:.0f}s; wrote {OUT_DIR / 'models.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

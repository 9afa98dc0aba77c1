"""``mnist_cnn``: the CNN the agent ships (``agent/shipped_models/mnist_cnn.onnx``) on its fixed MNIST-5k splits.

Input ``input`` float32 ``[N, 1, 28, 28]`` raw pixels 0..255, output ``logits`` ``[N, 10]``; the value
feeding the last ``Gemm`` is the penultimate representation. The splits are
:func:`agent.data.datasets.mnist_splits` (train 2,500, validation 1,500, test 1,000), the same for every
seed; ``seed`` only seeds the shifts' randomness where they have any. Shifts: ``blur`` (up to σ = 2
pixels) and ``brightness`` (see :mod:`.images`).
"""

from __future__ import annotations

import os

from bench.zoo.core import Split, ZooModel, graph_inputs
from bench.zoo.images import blur, brightness

MAX_BLUR_SIGMA = 2.0


def _penultimate(model: bytes) -> str | None:
    import onnx

    gemms = [n for n in onnx.load_from_string(model).graph.node if n.op_type == "Gemm"]
    return gemms[-1].input[0] if gemms else None


def build(workdir: str | os.PathLike[str] | None = None, seed: int = 0) -> ZooModel:
    """The shipped model and splits (``workdir`` and ``seed`` unused: nothing is built or drawn)."""
    del workdir, seed
    from agent.data.datasets import mnist_splits
    from agent.model.classifier import default_model_path

    path = default_model_path()
    data = path.read_bytes()
    s = mnist_splits()
    return ZooModel(
        name="mnist_cnn",
        kind="image",
        path=path,
        inputs=graph_inputs(data),
        classes=tuple(str(d) for d in range(10)),
        train=Split({"input": s.train.x}, s.train.y),
        val=Split({"input": s.val.x}, s.val.y),
        test=Split({"input": s.test.x}, s.test.y),
        scores_output="logits",
        scores_kind="logits",
        shifts={"blur": blur("NCHW", MAX_BLUR_SIGMA), "brightness": brightness("NCHW")},
        penultimate=_penultimate(data),
    )

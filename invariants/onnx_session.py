"""The one adapter around :mod:`onnxruntime`.

Every other module runs ONNX graphs through :class:`OnnxSession`; nothing else imports
``onnxruntime``. Sessions are created with a bounded thread pool so that several sessions
(the served model, the ADI forest, audit variants) can live in one process.

onnxruntime keeps the memory of a run in its arena for the next one: one run over a large batch would
leave hundreds of MB in a serving process for good. A run whose inputs exceed
:data:`SHRINK_AFTER_BYTES` asks the arena to give back what it grew for that run
(``memory.enable_memory_arena_shrinkage``); small runs keep the arena warm.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Runs whose inputs take more bytes than this shrink the memory arena back when they finish.
SHRINK_AFTER_BYTES = 1 << 20

_ORT_TYPES: dict[str, np.dtype] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(string)": np.dtype(object),
}


class OnnxLoadError(ValueError):
    """The file is not an ONNX model onnxruntime can load."""


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape (``None`` for a dynamic dimension) and numpy dtype of a graph input/output."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype
    onnx_type: str


def _dims(shape: Sequence[object]) -> tuple[int | None, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else None for d in shape)


class OnnxSession:
    """A loaded ONNX graph: metadata of its inputs/outputs and a thread-safe ``run``.

    ``onnxruntime.InferenceSession.run`` releases the GIL and may be called from several
    threads at once, so one instance serves a whole thread pool.
    """

    def __init__(
        self,
        model: bytes | str | os.PathLike[str],
        *,
        intra_op_threads: int | None = None,
        inter_op_threads: int = 1,
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(
            intra_op_threads if intra_op_threads is not None else os.environ.get("ICOS_AGENT_ORT_THREADS", 1)
        )
        options.inter_op_num_threads = inter_op_threads
        options.log_severity_level = 3
        source: bytes | str = model if isinstance(model, bytes) else str(Path(model))
        try:
            self._session = ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            where = "in-memory model" if isinstance(model, bytes) else str(model)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OnnxLoadError(f"cannot load ONNX model {where}: {first}") from exc
        self.inputs: list[TensorInfo] = [
            TensorInfo(i.name, _dims(i.shape), _ORT_TYPES.get(i.type, np.dtype(object)), i.type)
            for i in self._session.get_inputs()
        ]
        self.outputs: list[TensorInfo] = [
            TensorInfo(o.name, _dims(o.shape), _ORT_TYPES.get(o.type, np.dtype(object)), o.type)
            for o in self._session.get_outputs()
        ]
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """Run the graph; ``outputs=None`` returns every output in graph order."""
        large = sum(getattr(v, "nbytes", 0) for v in feeds.values()) > SHRINK_AFTER_BYTES
        names = list(outputs) if outputs is not None else None
        result = self._session.run(names, dict(feeds), self._shrink if large else None)
        return [np.asarray(r) for r in result]

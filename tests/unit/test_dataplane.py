"""DataPlane.infer (agent/dataplane/plane.py) with the shipped MNIST CNN's real ONNX runtime and bundle,
built from its parts as the composition root builds it: the serve-mode answer (outputs, ids, the
model's probabilities and labels), verdicts (the reference oracle's, IDI metadata per batch and per
sample, judged off the answer when not asked for), and the client's errors, which record nothing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.config.settings import AgentSettings
from agent.data.datasets import Splits
from agent.dataplane.admission import PREDICTION_COUNT, SERVE_OUTPUTS
from agent.dataplane.modes import Mode, ObserveMode, ServeMode
from agent.dataplane.observe_intake import ObserveIntake
from agent.dataplane.plane import DataPlane
from agent.dataplane.policy import BatchedRecording, ServingPolicy
from agent.dataplane.runtimes import RuntimeHolder
from agent.errors import ClientError
from agent.judging.loop import LoopRecorder, VerdictBatcher
from agent.judging.queue import JudgeQueue
from agent.judging.recorder import Recorder
from agent.judging.runtime import Runtime, load_runtime
from agent.judging.windows import WindowSet
from agent.model.classifier import InvalidInput, OnnxClassifier, default_model_path
from agent.protocol.inference import InferRequest, InferResponse, ProtocolError, RequestedOutput, Tensor
from exporters.prometheus import AgentMetrics
from invariants.bundle import Bundle
from invariants.oracle import VERDICTS
from tests.support.metrics import Scrape
from tests.support.settings import mnist_settings

MAX_BATCH = 16


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


@dataclass
class Plane:
    """A DataPlane and the windows, judge queue and metrics it records into."""

    plane: DataPlane
    windows: WindowSet
    queue: JudgeQueue
    registry: CollectorRegistry

    def infer(self, request: InferRequest, size: int = 1024, binary: bool = False) -> InferResponse:
        """One request, placed as one of ``size`` bytes would be, on a fresh event loop."""

        async def go() -> InferResponse:
            async with self.plane.place(size, binary) as place:
                return await self.plane.infer(request, place)

        return asyncio.run(go())

    def recorded(self) -> int:
        """Predictions in the windows once everything answered is recorded."""
        self.queue.flush()
        return int(self.windows.total)


@pytest.fixture(scope="module")
def settings(mnist_bundle_dir: Path) -> AgentSettings:
    model = {"name": "mnist", "version": "3", "path": str(default_model_path())}
    return mnist_settings(mnist_bundle_dir, model=model, server={"max_batch": MAX_BATCH})


@pytest.fixture(scope="module")
def runtime(settings: AgentSettings) -> Runtime:
    return load_runtime(settings)


def build(settings: AgentSettings, runtime: Runtime, mode_name: str = "serve") -> Plane:
    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    windows = WindowSet(settings.window_seconds, settings.windows.count)
    queue = JudgeQueue(Recorder(windows, metrics))
    recording = BatchedRecording(VerdictBatcher(_in_thread), LoopRecorder(queue), queue)
    runtimes = RuntimeHolder(runtime, settings, windows, metrics)
    mode: Mode = (
        ObserveMode(ObserveIntake(settings, runtimes, queue, metrics, _in_thread, recording))
        if mode_name == "observe"
        else ServeMode()
    )
    policy = ServingPolicy(_in_thread, recording, has_model=mode.runs_model)
    return Plane(DataPlane(runtimes, mode, policy), windows, queue, registry)


@pytest.fixture
def serve(settings: AgentSettings, runtime: Runtime) -> Plane:
    return build(settings, runtime)


def request(
    x: np.ndarray,
    outputs: tuple[str, ...] | None = SERVE_OUTPUTS,
    rid: str | None = "req-1",
    model: str = "mnist",
    version: str | None = None,
    parameters: dict[str, Any] | None = None,
    extra: list[Tensor] | None = None,
) -> InferRequest:
    inputs = [Tensor("input", "FP32", list(x.shape), np.ascontiguousarray(x, dtype=np.float32)), *(extra or [])]
    wanted = [RequestedOutput(n, False) for n in outputs] if outputs is not None else None
    return InferRequest(rid, parameters or {}, inputs, wanted, False, False, model, version)


def reference_verdicts(bundle: Path, model: OnnxClassifier, x: np.ndarray, metadata: Any = None) -> list[str]:
    pred = model.predict(x)
    judged = Bundle.load(bundle).oracle().judge(x.reshape(len(x), -1), pred.probabilities, pred.predicted, metadata)
    return [VERDICTS[v] for v in judged.verdict]


@pytest.fixture
def off_idi(mnist_splits: Splits) -> np.ndarray:
    """Test images of digits the IDI rule ``form == lines`` refuses (it allows 1, 4 and 7)."""
    y = mnist_splits.test.y
    return mnist_splits.test.x[~np.isin(y, [1, 4, 7])][:6]


def test_serve_answers_the_models_outputs_and_the_oracles_verdicts(
    serve: Plane, mnist_splits: Splits, mnist_model: OnnxClassifier, mnist_bundle_dir: Path
) -> None:
    x = mnist_splits.test.x[:12]
    answer = serve.infer(request(x))
    assert (answer.model_name, answer.model_version, answer.id) == ("mnist", "3", "req-1")
    assert answer.parameters == {PREDICTION_COUNT: 12}
    assert [t.name for t in answer.outputs] == list(SERVE_OUTPUTS)
    expected = mnist_model.predict(x)
    probabilities, labels, verdicts = (answer.output(n) for n in SERVE_OUTPUTS)
    assert probabilities is not None and labels is not None and verdicts is not None
    assert (probabilities.datatype, labels.datatype, verdicts.datatype) == ("FP32", "INT64", "BYTES")
    np.testing.assert_allclose(probabilities.data, expected.probabilities, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(labels.data, expected.predicted)
    assert [v.decode() for v in verdicts.data] == reference_verdicts(mnist_bundle_dir, mnist_model, x)
    assert serve.recorded() == 12


def test_outputs_asked_for_in_their_order_and_an_id_when_none_is_given(serve: Plane, mnist_splits: Splits) -> None:
    x = mnist_splits.test.x[:2]
    answer = serve.infer(request(x, outputs=("label", "probabilities"), rid=None))
    assert [t.name for t in answer.outputs] == ["label", "probabilities"]
    assert answer.id is not None and len(answer.id) == 32 and int(answer.id, 16) >= 0
    every = serve.infer(request(x, outputs=None))
    assert [t.name for t in every.outputs] == list(SERVE_OUTPUTS)


def test_idi_metadata_per_batch_and_per_sample(
    serve: Plane, off_idi: np.ndarray, mnist_model: OnnxClassifier, mnist_bundle_dir: Path
) -> None:
    batch = serve.infer(request(off_idi, outputs=("icos_verdict",), parameters={"form": "lines"}))
    assert batch.outputs[0].data.tolist() == [b"fail:idi"] * 6
    forms = ["lines", "curves", "lines", "", "curves", "lines"]
    form = Tensor("form", "BYTES", [6], np.array([f.encode() for f in forms], dtype=object))
    per_sample = serve.infer(request(off_idi, outputs=("icos_verdict",), extra=[form]))
    got = [v.decode() for v in per_sample.outputs[0].data]
    assert [v == "fail:idi" for v in got] == [f == "lines" for f in forms]
    metadata = {"form": np.array(forms)}
    assert got == reference_verdicts(mnist_bundle_dir, mnist_model, off_idi, metadata)


def test_verdicts_not_asked_for_are_judged_after_the_answer(serve: Plane, mnist_splits: Splits) -> None:
    x = mnist_splits.test.x[:5]
    answer = serve.infer(request(x, outputs=("label",)))
    assert answer.output("icos_verdict") is None
    assert serve.recorded() == 5
    counted = Scrape.of_registry(serve.registry)
    assert counted.value("icos_predictions_total", model="mnist", version="3") == 5
    assert counted.value("icos_verdicts_total") == 5


def test_placement_does_not_change_the_answer(serve: Plane, mnist_splits: Splits) -> None:
    """Every stage on the loop (small), only the model in a thread (large binary), all in threads (large JSON)."""
    x = mnist_splits.test.x[:8]
    answers = [
        serve.infer(request(x), size=1024),
        serve.infer(request(x), size=1 << 20, binary=True),
        serve.infer(request(x), size=1 << 20),
    ]
    for answer in answers[1:]:
        for got, want in zip(answer.outputs, answers[0].outputs, strict=True):
            assert got.name == want.name
            np.testing.assert_array_equal(got.data, want.data)
    assert serve.recorded() == 24


@pytest.mark.parametrize(
    ("case", "kind", "status", "reason"),
    [
        ("unknown model", ClientError, 404, "unknown_model"),
        ("unknown version", ClientError, 404, "unknown_model"),
        ("unknown output", ProtocolError, 400, "unknown_output"),
        ("wrong input name", ProtocolError, 400, "unknown_input"),
        ("bytes input", ProtocolError, 400, "datatype"),
        ("two data inputs", ProtocolError, 400, "unknown_input"),
        ("metadata list", ProtocolError, 400, "metadata"),
        ("metadata count", ProtocolError, 400, "metadata"),
        ("wrong shape", InvalidInput, 400, "shape"),
        ("batch over max_batch", InvalidInput, 413, "too_large"),
    ],
)
def test_a_clients_mistake_is_its_error_and_records_nothing(
    serve: Plane, mnist_splits: Splits, case: str, kind: type[ClientError], status: int, reason: str
) -> None:
    x = mnist_splits.test.x[:3]
    bad = {
        "unknown model": lambda: request(x, model="resnet"),
        "unknown version": lambda: request(x, version="9"),
        "unknown output": lambda: request(x, outputs=("label", "logits")),
        "wrong input name": lambda: InferRequest(
            None, {}, [Tensor("pixels", "FP32", list(x.shape), x)], None, False, False, "mnist"
        ),
        "bytes input": lambda: InferRequest(
            None, {}, [Tensor("input", "BYTES", [1], np.array([b"x"], dtype=object))], None, False, False, "mnist"
        ),
        "two data inputs": lambda: request(x, extra=[Tensor("other", "FP32", list(x.shape), x)]),
        "metadata list": lambda: request(x, parameters={"form": ["lines"]}),
        "metadata count": lambda: request(
            x, extra=[Tensor("form", "BYTES", [2], np.array([b"lines", b"curves"], dtype=object))]
        ),
        "wrong shape": lambda: request(np.zeros((3, 1, 20, 20), np.float32)),
        "batch over max_batch": lambda: request(mnist_splits.test.x[: MAX_BATCH + 1]),
    }[case]()
    with pytest.raises(kind) as info:
        serve.infer(bad)
    assert (info.value.status, info.value.reason) == (status, reason), str(info.value)
    assert str(info.value)
    assert serve.recorded() == 0


def test_observe_mode_refuses_inference(settings: AgentSettings, runtime: Runtime, mnist_splits: Splits) -> None:
    observe = build(settings, runtime, "observe")
    with pytest.raises(ClientError) as info:
        observe.infer(request(mnist_splits.test.x[:2]))
    assert (info.value.status, info.value.reason) == (404, "mode") and "POST /v1/observe" in str(info.value)
    assert observe.recorded() == 0


def test_model_metadata_names_the_served_model(serve: Plane) -> None:
    meta = asyncio.run(serve.plane.model_metadata("mnist", None))
    assert meta["name"] == "mnist" and meta["versions"] == ["3"]
    assert [o["name"] for o in meta["outputs"]] == list(SERVE_OUTPUTS)
    with pytest.raises(ClientError) as info:
        asyncio.run(serve.plane.model_metadata("mnist", "4"))
    assert info.value.status == 404

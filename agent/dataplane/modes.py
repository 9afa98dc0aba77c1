"""The agent's modes behind the dataplane: who produces the predictions a request is answered with.

* :class:`ServeMode`: the agent runs the ONNX model itself;
* :class:`~agent.dataplane.proxy.ProxyMode`: it forwards the request to an upstream V2 server;
* :class:`ObserveMode`: predictions are made elsewhere and come to ``POST /v1/observe``
  (:mod:`agent.dataplane.observe_intake`); inference requests are refused.

Each mode admits a request (validates it against the model), predicts (or has the upstream predict),
and answers; judging and recording between the last two are the dataplane's. A mode also says what it
needs around the requests, so that the agent never asks which mode it runs: what it starts and stops
with the agent (proxy mode's upstream client and readiness checks, observe mode's intake workers), what
follows a reload (proxy mode reads the upstream's metadata again), whether the agent runs the model
(:attr:`Mode.runs_model`) and whether the judge queue's background thread records its predictions.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np

from agent.dataplane.admission import (
    OUTPUT_LABEL,
    OUTPUT_PROBABILITIES,
    OUTPUT_VERDICT,
    PREDICTION_COUNT,
    SERVE_OUTPUTS,
    VERDICT_BYTES,
    VERDICT_VOCABULARY,
    Admitted,
    Predicted,
    admit,
)
from agent.dataplane.metadata import model_metadata_of
from agent.dataplane.model_rows import ModelRows
from agent.dataplane.observe_intake import ObserveIntake
from agent.dataplane.policy import Placement
from agent.errors import ClientError
from agent.judging.runtime import Runtime
from agent.judging.state import StateStore
from agent.judging.verdicts import JudgeWork
from agent.model.classifier import Prediction
from agent.protocol.inference import InferRequest, InferResponse, Tensor, tensor


class Mode(Protocol):
    """What the dataplane and the agent ask of a mode."""

    name: str
    #: the agent runs the model itself on the request path (serve mode)
    runs_model: bool
    #: the judge queue's background thread records the requests' predictions (observe mode's intake
    #: workers record theirs themselves)
    background_judging: bool

    async def admit(self, rt: Runtime, request: InferRequest, place: Placement) -> Admitted:
        """Validate the request against the model (raises the client's errors)."""

    async def predict(self, admitted: Admitted, place: Placement) -> Predicted:
        """The predictions for an admitted request, as a work for the judge."""

    def answer(self, admitted: Admitted, predicted: Predicted) -> InferResponse:
        """The answer, once the work is judged when verdicts were asked for."""

    async def metadata(self, rt: Runtime) -> dict[str, Any]:
        """The V2 model metadata this mode advertises."""

    def not_ready(self) -> str | None:
        """Why the mode cannot answer now (proxy mode: its upstream is not ready); ``None`` when it can."""

    async def start(self, store: StateStore | None) -> None:
        """Start what the mode runs beside the requests (``store``: the state directory's, when there is one)."""

    async def stop(self, store: StateStore | None) -> None:
        """Stop it, once no request is served any more (what is left is saved in ``store``)."""

    async def after_reload(self) -> None:
        """Follow a reload that swapped the runtime."""


class _NothingAround:
    """A mode that runs nothing beside its requests and needs nothing after a reload."""

    async def start(self, store: StateStore | None) -> None:
        return None

    async def stop(self, store: StateStore | None) -> None:
        return None

    async def after_reload(self) -> None:
        return None


def _run_model(admitted: Admitted) -> tuple[Prediction, float]:
    classifier = admitted.rt.classifier
    assert classifier is not None
    t0 = time.perf_counter()
    pred = classifier.predict_prepared(admitted.x)
    return pred, time.perf_counter() - t0


def agent_outputs(admitted: Admitted, work: JudgeWork) -> dict[str, Tensor]:
    """The agent's own outputs a request asked for, from its judged work."""
    out: dict[str, Tensor] = {}
    for name, binary in admitted.wanted:
        if name == OUTPUT_PROBABILITIES:
            out[name] = tensor(OUTPUT_PROBABILITIES, work.probabilities, "FP32")
        elif name == OUTPUT_LABEL:
            out[name] = tensor(OUTPUT_LABEL, work.predicted.astype(np.int64, copy=False), "INT64")
        elif name == OUTPUT_VERDICT:
            codes = work.verdicts_or_raise()
            out[name] = tensor(OUTPUT_VERDICT, VERDICT_BYTES[codes], "BYTES")
            out[name].coded = (codes, VERDICT_VOCABULARY)
        else:
            continue
        out[name].binary = binary
    return out


class ServeMode(_NothingAround):
    """The agent runs the model: the outputs are its probabilities, predicted class and verdicts."""

    name = "serve"
    runs_model = True
    background_judging = True

    def __init__(self) -> None:
        #: one full batch's rows in the model at once (its activations bounded: :mod:`~agent.dataplane.model_rows`)
        self.model_rows = ModelRows()

    async def admit(self, rt: Runtime, request: InferRequest, place: Placement) -> Admitted:
        assert rt.classifier is not None
        admitted: Admitted = await place.run(admit, rt, request, SERVE_OUTPUTS)
        return admitted

    async def predict(self, admitted: Admitted, place: Placement) -> Predicted:
        rows = await self.model_rows.take(admitted.x.n, admitted.rt.max_batch)
        try:
            pred, seconds = await place.run_model(_run_model, admitted)
        finally:
            self.model_rows.give(rows)
        rt = admitted.rt
        features = rt.features(admitted.x, pred)
        work = JudgeWork(
            rt,
            features,
            pred.probabilities,
            pred.predicted,
            admitted.metadata,
            seconds,
            admitted.request_id,
            inputs=admitted.x,
        )
        return Predicted(work)

    def answer(self, admitted: Admitted, predicted: Predicted) -> InferResponse:
        rt, work = admitted.rt, predicted.work
        outputs = agent_outputs(admitted, work)
        return InferResponse(
            rt.name, rt.version, work.request_id, {PREDICTION_COUNT: work.n}, [outputs[n] for n, _ in admitted.wanted]
        )

    async def metadata(self, rt: Runtime) -> dict[str, Any]:
        return model_metadata_of(rt)

    def not_ready(self) -> str | None:
        return None


class ObserveMode(_NothingAround):
    """Predictions come to ``POST /v1/observe`` (its :attr:`intake`, whose workers judge and record
    them); inference requests are refused (404)."""

    name = "observe"
    runs_model = False
    background_judging = False

    def __init__(self, intake: ObserveIntake) -> None:
        self.intake = intake

    async def start(self, store: StateStore | None) -> None:
        """Take the batches a previous run saved in ``store``, then start the intake's workers."""
        await self.intake.start(store)

    async def stop(self, store: StateStore | None) -> None:
        """Judge what is queued (bounded by the graceful timeout) and save the rest in ``store``."""
        await self.intake.stop(store)

    async def admit(self, rt: Runtime, request: InferRequest, place: Placement) -> Admitted:
        raise ClientError(
            "inference is not served in observe mode; send predictions to POST /v1/observe", status=404, reason="mode"
        )

    async def predict(self, admitted: Admitted, place: Placement) -> Predicted:
        raise AssertionError("observe mode admits no inference request")

    def answer(self, admitted: Admitted, predicted: Predicted) -> InferResponse:
        raise AssertionError("observe mode admits no inference request")

    async def metadata(self, rt: Runtime) -> dict[str, Any]:
        return model_metadata_of(rt)

    def not_ready(self) -> str | None:
        return None

"""Proxy mode: forward V2 inference requests to an upstream V2 server and judge its answer.

What the upstream takes and answers comes from its metadata (:class:`~agent.dataplane.upstream.UpstreamModel`,
read at start and on reload): the agent advertises the upstream's inputs and outputs beside its own
``probabilities``, ``label`` and ``icos_verdict``; it asks the upstream explicitly for the output that
holds the class scores (e.g. MLServer scikit-learn's ``predict_proba``) plus the upstream outputs the
client named; it sends binary tensors only to an upstream that advertises the binary extension
(otherwise JSON) and encodes the answer for the client as the client asked. A request that names no
outputs gets serve mode's defaults: ``probabilities``, ``label``, ``icos_verdict``.
"""

from __future__ import annotations

import time
from typing import Any

from agent.config.settings import AgentSettings
from agent.core import logs
from agent.dataplane.admission import (
    OUTPUT_VERDICT,
    PREDICTION_COUNT,
    SERVE_OUTPUTS,
    Admitted,
    Predicted,
    attach_metadata,
    new_request_id,
    split_inputs,
)
from agent.dataplane.metadata import model_metadata_of
from agent.dataplane.modes import agent_outputs
from agent.dataplane.observe import output_probabilities
from agent.dataplane.policy import Placement
from agent.dataplane.upstream import UpstreamClient, UpstreamError, UpstreamModel
from agent.dataplane.upstream_readiness import UpstreamReadiness
from agent.judging.runtime import Runtime
from agent.judging.state import StateStore
from agent.judging.verdicts import JudgeWork
from agent.model.inputs import rule_values
from agent.protocol import v2
from agent.protocol.inference import InferRequest, InferResponse, ProtocolError, RequestedOutput, Tensor
from exporters.upstream_metrics import UpstreamMetrics

log = logs.get("app")


def proxy_metadata(own: dict[str, Any], up: UpstreamModel) -> dict[str, Any]:
    """The model metadata a proxy advertises: the upstream's inputs (the agent's own description when
    it lists none) and metadata fields, then the upstream's outputs, the scores output it answers
    when asked, and the agent's outputs (an upstream output of the same name is the one answered)."""
    meta = dict(own)
    if up.inputs:
        fields = [i for i in own["inputs"][1:] if i["name"] not in {u["name"] for u in up.inputs}]
        meta["inputs"] = [*up.inputs, *fields]
    outputs = list(up.outputs)
    if up.scores_output is not None and up.scores_output not in up.output_names:
        k = own["outputs"][0]["shape"][-1]
        outputs.append({"name": up.scores_output, "datatype": "FP64", "shape": [-1, k]})
    names = {o["name"] for o in outputs}
    meta["outputs"] = [*outputs, *[o for o in own["outputs"] if o["name"] not in names]]
    meta["parameters"] = {**own["parameters"], "icos_upstream_server": up.server_name or "unknown"}
    if up.scores_output is not None:
        meta["parameters"]["icos_upstream_scores_output"] = up.scores_output
    return meta


def _wanted(req: InferRequest, up: UpstreamModel) -> list[tuple[str, bool]]:
    """The outputs the client gets, with their encodings; unknown names refused when the upstream
    lists its outputs (when it lists none, other names are asked of it and it decides)."""
    if req.outputs is None:
        return [(name, req.binary_output) for name in SERVE_OUTPUTS]
    if up.outputs:
        available = [*up.output_names, *[n for n in SERVE_OUTPUTS if n not in up.output_names]]
        if up.scores_output is not None and up.scores_output not in available:
            available.append(up.scores_output)
        for r in req.outputs:
            if r.name not in available:
                raise ProtocolError("unknown_output", f"unknown output {r.name!r}; available: {', '.join(available)}")
    return [(r.name, r.binary) for r in req.outputs]


def _from_upstream(name: str, up: UpstreamModel) -> bool:
    """Whether output ``name`` is the upstream's (else the agent computes it)."""
    if name == OUTPUT_VERDICT:
        return False
    return name not in SERVE_OUTPUTS or name in up.output_names


def proxy_admit(rt: Runtime, up: UpstreamModel, req: InferRequest) -> Admitted:
    """Validate the client's request and encode what is forwarded.

    Only the model input is forwarded, as binary tensors when both the client and the upstream use
    them, else as JSON. The forwarded request names the scores output and the upstream outputs the
    client asked for; when the scores output is not known, it names none (the upstream answers all).
    """
    split = split_inputs(rt, req.inputs, req.parameters)
    x = rt.prepare(split.arrays())
    meta = attach_metadata(split, x.n, rule_values(x, rt.input_fields))
    wanted = _wanted(req, up)  # refuses unknown names before the upstream is called
    binary = req.used_binary and up.binary
    params = {k: v for k, v in req.parameters.items() if k not in rt.metadata_fields and k != "binary_data_output"}
    if binary:
        params["binary_data_output"] = True
    outputs: list[RequestedOutput] | None = None
    if up.scores_output is not None:
        names = [up.scores_output]
        names += [n for n, _ in wanted if _from_upstream(n, up) and n not in names]
        outputs = [RequestedOutput(n, binary) for n in names]
    data = [Tensor(t.name, t.datatype, t.shape, t.data) for t in split.data.values()]
    forward = v2.encode_request(data, binary=binary, request_id=req.id, parameters=params, outputs=outputs)
    return Admitted(rt, req, req.id or "", wanted, x, meta, forward)


def proxy_predicted(
    up: UpstreamModel, admitted: Admitted, body: bytes, header_length: str | None, seconds: float
) -> Predicted:
    """The upstream's answer to a forwarded request as a work for the judge (502 when it is unreadable
    or does not match the request)."""
    rt, x = admitted.rt, admitted.x
    try:
        resp = v2.decode_response(body, header_length)
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", f"upstream answered an unreadable response: {exc}") from None
    try:
        probs = output_probabilities(rt, resp.outputs, up.scores_output, "upstream response")
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", str(exc)) from None
    n = x.n
    if probs.shape[0] != n:
        raise UpstreamError(502, "bad_response", f"upstream returned {probs.shape[0]} predictions for {n} inputs")
    rid = admitted.request_id or resp.id or new_request_id()
    work = JudgeWork(rt, rt.features(x), probs, rt.predicted_classes(probs), admitted.metadata, seconds, rid, inputs=x)
    answered = {t.name: t for t in resp.outputs if t.name != OUTPUT_VERDICT}
    params = {k: v for k, v in resp.parameters.items() if isinstance(v, str | int | float | bool)}
    return Predicted(work, answered, params)


def proxy_answer(up: UpstreamModel, admitted: Admitted, predicted: Predicted) -> InferResponse:
    """The outputs the client asked for, the upstream's and the agent's, each encoded as it asked."""
    work = predicted.work
    own = agent_outputs(admitted, work)
    out = []
    for name, binary in admitted.wanted:
        answered = predicted.upstream_outputs.get(name)
        if answered is not None and (_from_upstream(name, up) or not up.read):
            t = Tensor(answered.name, answered.datatype, answered.shape, answered.data, binary=binary)
        elif name in own:
            t = own[name]
        else:
            raise UpstreamError(502, "bad_response", f"upstream response has no output {name!r}")
        out.append(t)
    rt = admitted.rt
    params = {**predicted.upstream_parameters, PREDICTION_COUNT: work.n}
    return InferResponse(rt.name, rt.version, work.request_id, params, out)


class ProxyMode:
    """Forwards each request to the upstream V2 server and judges its answer; what the upstream takes
    and answers comes from its metadata, read whenever the upstream becomes ready (at start, and after
    an outage), on reload, and on the first request when it could not be read before. The mode is
    ready while the upstream's model is (:class:`~agent.dataplane.upstream_readiness.UpstreamReadiness`)."""

    name = "proxy"
    runs_model = False
    background_judging = True

    def __init__(self, settings: AgentSettings, metrics: UpstreamMetrics) -> None:
        s = settings
        assert s.upstream.url is not None
        self.settings = s
        self.upstream = UpstreamClient(
            s.upstream.url,
            s.upstream.timeout_seconds,
            max_connections=64,
            max_response_bytes=s.upstream.max_response_bytes,
        )
        #: What the upstream's metadata says; ``None`` until it has been read.
        self.upstream_model: UpstreamModel | None = None
        self.readiness = UpstreamReadiness(
            lambda: self.upstream.model_ready(s.upstream_model_name, s.upstream.ready_timeout_seconds),
            s.upstream.ready_interval_seconds,
            metrics,
            on_ready=lambda: self.refresh(at_start=True),
        )

    async def admit(self, rt: Runtime, request: InferRequest, place: Placement) -> Admitted:
        up = await self.upstream_info()
        admitted: Admitted = await place.run(proxy_admit, rt, up, request)
        return admitted

    async def predict(self, admitted: Admitted, place: Placement) -> Predicted:
        assert admitted.forward is not None
        up = await self.upstream_info()
        t0 = time.perf_counter()
        body, header_length = await self.upstream.infer(self.settings.upstream_model_name, *admitted.forward)
        seconds = time.perf_counter() - t0
        predicted: Predicted = await place.run(proxy_predicted, up, admitted, body, header_length, seconds)
        return predicted

    def answer(self, admitted: Admitted, predicted: Predicted) -> InferResponse:
        return proxy_answer(self.upstream_model or UpstreamModel(), admitted, predicted)

    async def metadata(self, rt: Runtime) -> dict[str, Any]:
        return proxy_metadata(model_metadata_of(rt), await self.upstream_info())

    def not_ready(self) -> str | None:
        reason = self.readiness.reason
        return None if reason is None else f"upstream not ready: {reason}"

    async def start(self, store: StateStore | None) -> None:
        """Check the upstream's readiness now (and read its metadata when it is ready), then every
        ``upstream.ready_interval_seconds`` in the background."""
        await self.readiness.start()

    async def stop(self, store: StateStore | None) -> None:
        """Stop the readiness checks and close the upstream client."""
        await self.readiness.stop()
        await self.upstream.aclose()

    async def after_reload(self) -> None:
        """Read the upstream's metadata again: the new model may take or answer other tensors."""
        await self.refresh()

    async def refresh(self, at_start: bool = False) -> UpstreamModel:
        """Read the upstream's server and model metadata. At start (or when the upstream becomes ready)
        a failure is logged, not raised: a sidecar may start before its model server."""
        s = self.settings
        try:
            info = await self.upstream.metadata(s.upstream_model_name, s.upstream.scores_output)
        except UpstreamError as exc:
            if not at_start:
                raise
            log.warning("upstream metadata not read yet; read again on the next request", extra={"error": str(exc)})
            return UpstreamModel()
        if self.upstream_model != info:
            log.info(
                "upstream metadata",
                extra={
                    "server": info.server_name or "unknown",
                    "binary_tensors": info.binary,
                    "inputs": [i["name"] for i in info.inputs],
                    "outputs": info.output_names,
                    "scores_output": info.scores_output,
                },
            )
        self.upstream_model = info
        return info

    async def upstream_info(self) -> UpstreamModel:
        """The upstream's metadata, read now if it could not be read before."""
        info = self.upstream_model
        return info if info is not None else await self.refresh()

"""Proxy mode: forward V2 inference requests to an upstream V2 server and judge its answer.

What the upstream takes and answers comes from its metadata (:class:`~agent.server.upstream.UpstreamModel`,
read at start and on reload): the agent advertises the upstream's inputs and outputs beside its own
``probabilities``, ``label`` and ``icos_verdict``; it asks the upstream explicitly for the output that
holds the class scores (e.g. MLServer scikit-learn's ``predict_proba``) plus the upstream outputs the
client named; it sends binary tensors only to an upstream that advertises the binary extension
(otherwise JSON) and encodes the answer for the client as the client asked. A request that names no
outputs gets serve mode's defaults: ``probabilities``, ``label``, ``icos_verdict``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agent.judging.pipeline import JudgeWork, Pipeline
from agent.judging.request_io import (
    OUTPUT_LABEL,
    OUTPUT_PROBABILITIES,
    OUTPUT_VERDICT,
    PREDICTION_COUNT,
    SERVE_OUTPUTS,
    VERDICT_BYTES,
    attach_metadata,
    new_request_id,
    split_inputs,
)
from agent.judging.runtime import Runtime
from agent.protocol import v2
from agent.protocol.v2 import ProtocolError, RequestedOutput
from agent.server.observe import output_probabilities
from agent.server.upstream import UpstreamError, UpstreamModel

__all__ = ["UpstreamError", "proxy_judge", "proxy_metadata", "proxy_prepare"]


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


def _wanted(req: v2.InferRequest, up: UpstreamModel) -> list[tuple[str, bool]]:
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


def proxy_prepare(rt: Runtime, up: UpstreamModel, body: bytes, header_length: str | None) -> tuple[Any, ...]:
    """Decode the client's request: ``(request, metadata, model input, body to forward, its headers)``.

    Only the model input is forwarded, as binary tensors when both the client and the upstream use
    them, else as JSON. The forwarded request names the scores output and the upstream outputs the
    client asked for; when the scores output is not known, it names none (the upstream answers all).
    """
    req = v2.decode_request(body, header_length, max_elements=rt.max_elements)
    split = split_inputs(rt, req.inputs, req.parameters)
    x = rt.prepare(split.data.data)
    meta = attach_metadata(split, x.shape[0])
    binary = req.used_binary and up.binary
    params = {k: v for k, v in req.parameters.items() if k not in rt.metadata_fields and k != "binary_data_output"}
    if binary:
        params["binary_data_output"] = True
    outputs: list[RequestedOutput] | None = None
    if up.scores_output is not None:
        names = [up.scores_output]
        names += [n for n, _ in _wanted(req, up) if _from_upstream(n, up) and n not in names]
        outputs = [RequestedOutput(n, binary) for n in names]
    else:
        _wanted(req, up)  # refuse unknown names before calling the upstream
    data = v2.Tensor(split.data.name, split.data.datatype, split.data.shape, split.data.data)
    fwd_body, fwd_headers = v2.encode_request(
        [data], binary=binary, request_id=req.id, parameters=params, outputs=outputs
    )
    return req, meta, x, fwd_body, fwd_headers


def proxy_judge(
    pipeline: Pipeline,
    up: UpstreamModel,
    rt: Runtime,
    req: v2.InferRequest,
    split_meta: dict[str, Any] | None,
    x: np.ndarray,
    body: bytes,
    header_length: str | None,
    seconds: float,
    *,
    record_now: bool = False,
) -> tuple[bytes, dict[str, str], str]:
    """Judge the upstream's answer to a forwarded request and answer the client with the outputs it
    asked for (the upstream's and the agent's), each encoded as the client asked; also the request id
    the answer carries. ``record_now`` records the predictions before returning (commit durability)
    rather than handing them to the background judge."""
    try:
        resp = v2.decode_response(body, header_length)
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", f"upstream answered an unreadable response: {exc}") from None
    try:
        probs = output_probabilities(rt, resp.outputs, up.scores_output, "upstream response")
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", str(exc)) from None
    n = x.shape[0]
    if probs.shape[0] != n:
        raise UpstreamError(502, "bad_response", f"upstream returned {probs.shape[0]} predictions for {n} inputs")
    labels = rt.labels_of(probs)
    rid = req.id or resp.id or new_request_id()
    answered = {t.name: t for t in resp.outputs if t.name != OUTPUT_VERDICT}
    wanted = _wanted(req, up)
    # only the oracle runs before the answer, and only when the client asked for the verdicts; the
    # windows, metrics and prediction store are updated by the background judge, many requests at once
    work = JudgeWork(rt, rt.features(x), probs, labels, split_meta, seconds, request_id=rid)
    if record_now:
        pipeline.judge_works([work])
    elif any(name == OUTPUT_VERDICT for name, _ in wanted):
        pipeline.verdicts_now([work])
    if work.error is not None:
        raise work.error
    if not record_now:
        pipeline.defer(work)
    verdicts = work.verdicts
    out = []
    for name, binary in wanted:
        if name == OUTPUT_VERDICT:
            assert verdicts is not None
            t = v2.tensor(OUTPUT_VERDICT, VERDICT_BYTES[verdicts], "BYTES")
        elif name in answered and (_from_upstream(name, up) or not up.read):
            t = answered[name]
            t = v2.Tensor(t.name, t.datatype, t.shape, t.data)
        elif name == OUTPUT_PROBABILITIES:
            t = v2.tensor(OUTPUT_PROBABILITIES, probs, "FP32")
        elif name == OUTPUT_LABEL:
            t = v2.tensor(OUTPUT_LABEL, labels, "INT64")
        else:
            raise UpstreamError(502, "bad_response", f"upstream response has no output {name!r}")
        out.append((t, binary))
    params = {k: v for k, v in resp.parameters.items() if isinstance(v, str | int | float | bool)}
    params[PREDICTION_COUNT] = n
    content, headers = v2.encode_response(rt.name, rt.version, rid, out, params)
    return content, headers, rid

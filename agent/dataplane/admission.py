"""Admitting a request: its inputs split into the model input and IDI metadata and validated, the
outputs it asks for, its request id; and what comes out of the model or the upstream for it.

Every judged prediction has an id ``<request id>:<index>`` so that delayed true labels can later be
joined to it. An answer carries the request id once (its ``id``) and the number of its predictions
(the parameter :data:`PREDICTION_COUNT`), never the ids themselves: a request id repeated per sample
would let a small request ask for an answer many times its size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.errors import ClientError
from agent.judging.runtime import Runtime
from agent.judging.verdicts import JudgeWork
from agent.model.inputs import Inputs, rule_values
from agent.protocol.inference import InferRequest, ProtocolError, RequestedOutput, Tensor, Vocabulary
from invariants.oracle import VERDICTS

VERDICT_BYTES = np.array([v.encode() for v in VERDICTS], dtype=object)
#: The verdicts as the values of a coded BYTES tensor (answers encode them in a few numpy operations).
VERDICT_VOCABULARY = Vocabulary(tuple(VERDICT_BYTES.tolist()))
OUTPUT_PROBABILITIES = "probabilities"
OUTPUT_LABEL = "label"
OUTPUT_VERDICT = "icos_verdict"
SERVE_OUTPUTS = (OUTPUT_PROBABILITIES, OUTPUT_LABEL, OUTPUT_VERDICT)


def new_request_id() -> str:
    """32 random hex digits (what ``uuid.uuid4().hex`` looks like, at a fifth of its cost)."""
    return os.urandom(16).hex()


#: The answer parameter holding the number of predictions; prediction ``i`` has the id ``<answer id>:<i>``.
PREDICTION_COUNT = "icos_prediction_count"


def prediction_id(request_id: str, index: int) -> str:
    """The id of a request's ``index``-th prediction: what delayed labels name."""
    return f"{request_id}:{index}"


def prediction_ids(request_id: str, n: int) -> list[str]:
    """The ids of a request's ``n`` predictions (for clients: the answer names only the request id)."""
    return [prediction_id(request_id, i) for i in range(n)]


class MetadataTooLarge(ClientError):
    """Per-sample metadata past its bounds (``server.max_batch`` values of ``server.max_metadata_value_bytes``
    each; in observe mode also ``observe.max_metadata_bytes`` per batch), refused before allocating."""

    status = 413
    reason = "metadata_too_large"


def _metadata_array(t: Tensor, max_values: int, max_value_bytes: int) -> np.ndarray:
    """A per-sample metadata input as a 1-D array, its bounds checked before anything is allocated.

    A fixed-width bytes array costs ``values × longest value``: one long string among many short ones
    would multiply the request's size (a 5 MB body could ask for gigabytes). At most ``max_values``
    values (the batch limit) of at most ``max_value_bytes`` each keep it below their product."""
    data = t.data.reshape(-1)
    if data.size > max_values:
        raise MetadataTooLarge(
            f"metadata input {t.name!r} has {data.size} values; the limit is {max_values} (server.max_batch)"
        )
    if t.datatype != "BYTES":
        return data
    if not data.size:
        return np.zeros(0, dtype="S1")
    longest = 0
    for i, item in enumerate(data.tolist()):
        size = len(item.encode()) if isinstance(item, str) else len(item)  # the decoder gives bytes
        if size > max_value_bytes:
            raise MetadataTooLarge(
                f"metadata input {t.name!r}: value {i} has {size} bytes; the limit is {max_value_bytes}"
                " (server.max_metadata_value_bytes)"
            )
        longest = max(longest, size)
    return np.asarray(data.tolist(), dtype=f"S{max(1, longest)}")


@dataclass
class SplitInputs:
    """A request's tensors sorted out: the model's inputs by name, batch-level metadata (request
    ``parameters``) and per-sample metadata (named BYTES inputs read by IDI rules)."""

    data: dict[str, Tensor]
    metadata: dict[str, Any] = field(default_factory=dict)
    per_sample: dict[str, np.ndarray] = field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """The model inputs' values by name (what :meth:`Runtime.prepare` validates)."""
        return {name: t.data for name, t in self.data.items()}


def split_inputs(rt: Runtime, inputs: Sequence[Tensor], parameters: Mapping[str, Any]) -> SplitInputs:
    """The model's inputs and the IDI metadata (request ``parameters`` for the batch, or named inputs).

    A tensor named like a model input is that input (its datatype must be the model's: no value is
    converted silently); one named like a metadata field of the bundle is metadata; other BYTES tensors
    are metadata the rules do not read (ignored). Where the agent does not know the input's name (proxy
    and observe modes with a bundle of a single input), the one numeric tensor is the input.
    """
    sig = rt.signature
    named = rt.input_name is not None or len(sig.inputs) > 1
    wanted = set(sig.names) if named else set()
    data: dict[str, Tensor] = {}
    for t in inputs:
        if t.name in wanted:
            data[t.name] = t
        elif t.name in rt.metadata_fields or t.datatype == "BYTES":
            continue
        elif not named and not data:
            data[sig.names[0] if sig.inputs else t.name] = t
        else:
            raise ProtocolError("unknown_input", _unknown(t.name, rt))
    if not data:
        raise ProtocolError("missing_input", "request has no model input, only metadata inputs")
    missing = [n for n in sig.names if n not in data] if named else []
    if missing:
        names = ", ".join(sig.names)
        raise ProtocolError("missing_input", f"missing input {missing[0]!r}; the model's inputs are {names}")
    for name, t in data.items():
        spec = sig.get(name)
        if spec is None:
            continue
        if t.datatype == "BYTES" and not spec.is_string:
            raise ProtocolError("datatype", f"input {name!r} has datatype BYTES; the model takes numbers")
        if (rt.classifier is not None or rt.bundle.inputs) and t.datatype != spec.datatype:
            # as Triton answers: a client converts, so that no value is silently rounded or reinterpreted
            raise ProtocolError(
                "datatype",
                f"input {name!r} has datatype {t.datatype}; the model's input is {spec.datatype}: send {spec.datatype}",
            )
    out = SplitInputs(data)
    for f in rt.metadata_fields:
        if f in parameters:
            v = parameters[f]
            if isinstance(v, dict | list):
                raise ProtocolError("metadata", f"parameter {f!r} must be a single value for the whole batch")
            out.metadata[f] = v
    for t in inputs:
        if t.name in rt.metadata_fields and t.name not in data:
            out.per_sample[t.name] = _metadata_array(t, rt.max_batch, rt.max_metadata_value_bytes)
    return out


def _unknown(name: str, rt: Runtime) -> str:
    known = f"; metadata inputs are {', '.join(sorted(rt.metadata_fields))}" if rt.metadata_fields else ""
    inputs = ", ".join(repr(n) for n in rt.signature.names)
    return f"unknown input {name!r}; the model's inputs are {inputs}{known}"


def attach_metadata(
    split: SplitInputs, n: int, rule_inputs: Mapping[str, np.ndarray] | None = None
) -> dict[str, Any] | None:
    """The metadata the oracle reads: batch-level, per-sample, and the named inputs the rules read."""
    meta = dict(split.metadata)
    meta.update(rule_inputs or {})
    for name, arr in split.per_sample.items():
        if arr.shape[0] != n:
            raise ProtocolError("metadata", f"metadata input {name!r} has {arr.shape[0]} values for {n} samples")
        meta[name] = arr
    return meta or None


def resolve_outputs(
    requested: Sequence[RequestedOutput] | None, available: Sequence[str], default_binary: bool
) -> list[tuple[str, bool]]:
    if requested is None:
        return [(name, default_binary) for name in available]
    out = []
    for r in requested:
        if r.name not in available:
            raise ProtocolError("unknown_output", f"unknown output {r.name!r}; available: {', '.join(available)}")
        out.append((r.name, r.binary))
    return out


@dataclass
class Admitted:
    """A request admitted to the model: validated, its outputs chosen, its predictions named."""

    rt: Runtime
    request: InferRequest
    request_id: str
    #: The outputs to answer, each with its HTTP encoding (binary or JSON).
    wanted: list[tuple[str, bool]]
    #: The model's inputs, validated and in the model's shapes and dtypes.
    x: Inputs
    metadata: dict[str, Any] | None
    #: What proxy mode forwards: the body and its headers (``None`` in serve mode).
    forward: tuple[bytes, dict[str, str]] | None = None

    @property
    def wants_verdicts(self) -> bool:
        return any(name == OUTPUT_VERDICT for name, _ in self.wanted)


@dataclass
class Predicted:
    """The model's (or the upstream's) answer to an admitted request, as a work for the judge."""

    work: JudgeWork
    #: Outputs the upstream answered (proxy mode), by name, and the parameters of its answer.
    upstream_outputs: dict[str, Tensor] = field(default_factory=dict)
    upstream_parameters: dict[str, Any] = field(default_factory=dict)


def admit(rt: Runtime, request: InferRequest, available: Sequence[str]) -> Admitted:
    """Validate a request against the model (raises the client's errors): its inputs split and
    prepared, the outputs it asks for among ``available``, its id (generated when it has none)."""
    split = split_inputs(rt, request.inputs, request.parameters)
    wanted = resolve_outputs(request.outputs, available, request.binary_output)
    x = rt.prepare(split.arrays())
    meta = attach_metadata(split, x.n, rule_values(x, rt.input_fields))
    return Admitted(rt, request, request.id or new_request_id(), wanted, x, meta)

"""Observe mode: judge predictions of a model served elsewhere, off the request path.

Two ways in, both on ``POST /v1/observe``:

* a JSON body with the inputs and the probabilities (``{"inputs": ..., "probabilities": ...,
  "metadata": {...}}``, inputs as a nested array or as V2 tensors; or V2 ``inputs`` + ``outputs``);
* KServe inference-logger CloudEvents (binary mode ``ce-*`` headers, or structured
  ``application/cloudevents+json``): the request event and the response event of one inference
  share a ``ce-id`` and are paired in a buffer bounded in events, in bytes and in time (a TTL); events
  left without their pair are counted (``expired``, ``evicted`` when the buffer is full, ``duplicate``),
  and an event that would pass the byte bound is refused with 429 (``overflow``).

Per-sample metadata strings are bounded (per value, as for requests, and per batch) before any array of them is built:
numpy stores N strings as N × the longest, so one long value in a large batch would ask for gigabytes.

Accepted batches go into a bounded queue judged by worker tasks in the thread pool; when the queue
is full the request is rejected with 429 rather than dropped silently.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.config.settings import AgentSettings
from agent.dataplane.admission import MetadataTooLarge, SplitInputs, attach_metadata, new_request_id, split_inputs
from agent.errors import ClientError
from agent.judging.runtime import Runtime
from agent.model.inputs import Inputs, rule_values
from agent.protocol import v2
from agent.protocol.v2 import ProtocolError, Tensor

REQUEST = "request"
RESPONSE = "response"

_MiB = 1024 * 1024


class PendingFull(ClientError):
    """A CloudEvent that would pass ``observe.max_pending_bytes``: retry once older events paired or expired."""

    status = 429
    reason = "observe_pending_full"


@dataclass(frozen=True)
class MetadataBounds:
    """Bounds on per-sample metadata strings, checked before the fixed-width arrays are allocated."""

    max_value: int = 1024
    max_total: int = 4 * _MiB

    @classmethod
    def of(cls, settings: AgentSettings) -> MetadataBounds:
        """Per value ``server.max_metadata_value_bytes`` (as for requests); per batch ``observe.max_metadata_bytes``."""
        return cls(settings.server.max_metadata_value_bytes, settings.observe.max_metadata_bytes)

    def check(self, fields: Iterable[tuple[str, Sequence[bytes]]]) -> None:
        """Refuse (413) a value longer than ``max_value``, or fields whose arrays (samples × longest
        value, as numpy stores them) would together take more than ``max_total`` bytes."""
        total = 0
        for name, values in fields:
            longest = 0
            for i, v in enumerate(values):
                if len(v) > self.max_value:
                    raise MetadataTooLarge(
                        f"metadata {name!r}: value {i} has {len(v)} bytes, over the limit of {self.max_value} "
                        "(server.max_metadata_value_bytes)"
                    )
                longest = max(longest, len(v))
            total += len(values) * longest
            if total > self.max_total:
                raise MetadataTooLarge(
                    f"metadata {name!r}: {len(values)} values of up to {longest} bytes take {total} bytes "
                    f"with the other fields, over the limit of {self.max_total} (observe.max_metadata_bytes)"
                )

    def check_tensors(self, rt: Runtime, tensors: Sequence[Tensor]) -> None:
        """:meth:`check` the BYTES tensors that :func:`split_inputs` turns into metadata arrays."""
        self.check(
            (t.name, t.data.reshape(-1).tolist())
            for t in tensors
            if t.name in rt.metadata_fields and t.datatype == "BYTES"
        )


@dataclass
class ObserveItem:
    """A batch waiting to be judged: prepared inputs, probabilities, metadata."""

    id: str
    x: Inputs
    probabilities: np.ndarray
    metadata: dict[str, Any] | None
    received: float

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """For the state store: arrays without pickle (text as fixed-width strings)."""
        arrays = {f"input:{k}": v.astype("U") if v.dtype.kind == "O" else v for k, v in self.x.items()}
        arrays["probabilities"] = self.probabilities
        scalars: dict[str, Any] = {}
        for k, v in (self.metadata or {}).items():
            if isinstance(v, np.ndarray):
                arrays[f"meta:{k}"] = v.astype("S") if v.dtype.kind == "O" else v
            else:
                scalars[k] = v
        return arrays, {"id": self.id, "received": self.received, "scalars": scalars}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> ObserveItem:
        md: dict[str, Any] = dict(meta.get("scalars") or {})
        inputs: dict[str, np.ndarray] = {}
        for k, v in arrays.items():
            if k.startswith("meta:"):
                md[k[5:]] = v
            elif k.startswith("input:"):
                inputs[k[6:]] = v.astype(object) if v.dtype.kind == "U" else v
        if "x" in arrays:  # saved before inputs were named
            inputs["input"] = arrays["x"]
        probs = arrays["probabilities"]
        return cls(str(meta["id"]), Inputs(inputs), probs, md or None, float(meta["received"]))


def _nested(name: str, value: object) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise ProtocolError("data", f"'{name}' is not a numeric array ({str(exc).splitlines()[0][:120]})") from None
    return arr


def output_probabilities(rt: Runtime, outputs: list[Tensor], scores_output: str | None, what: str) -> np.ndarray:
    by_name = {t.name: t for t in outputs}
    if scores_output is not None:
        t = by_name.get(scores_output)
        if t is None:
            raise ProtocolError("scores", f"{what} has no output {scores_output!r}")
    elif "probabilities" in by_name:
        t = by_name["probabilities"]
    else:
        floats = [o for o in outputs if o.datatype.startswith("FP")]
        if len(floats) != 1:
            raise ProtocolError(
                "scores", f"{what}: cannot tell which output holds the class scores; set upstream.scores_output"
            )
        t = floats[0]
    return rt.to_probabilities(t.data, f"{what} output {t.name!r}")


def _check_probabilities(rt: Runtime, probs: np.ndarray, n: int) -> np.ndarray:
    if probs.shape[0] != n:
        raise ProtocolError("shape_mismatch", f"{n} inputs but {probs.shape[0]} probability vectors")
    return probs


def _prepare(rt: Runtime, split: SplitInputs) -> tuple[Inputs, dict[str, Any] | None]:
    x = rt.prepare(split.arrays())
    return x, attach_metadata(split, x.n, rule_values(x, rt.input_fields))


def decode_observation(
    rt: Runtime, body: bytes, scores_output: str | None, bounds: MetadataBounds | None = None
) -> ObserveItem:
    """A direct ``/v1/observe`` JSON body → a batch to judge (raises ProtocolError/InvalidInput)."""
    bounds = bounds or MetadataBounds()
    obj, _ = v2.split_body(body, None)
    rid = v2.check_request_id(obj.get("id"))
    if "inputs" not in obj:
        raise ProtocolError("malformed_json", "observation has no 'inputs'")
    raw_inputs = obj["inputs"]
    params = obj.get("parameters") or obj.get("metadata") or {}
    if not isinstance(params, dict):
        raise ProtocolError("malformed_json", "'metadata' must be an object")
    if isinstance(raw_inputs, list) and raw_inputs and isinstance(raw_inputs[0], dict):
        tensors, _ = v2.decode_tensors(raw_inputs, memoryview(b""), "inputs", max_elements=rt.max_elements)
    else:
        with np.errstate(over="ignore"):  # beyond float32 → ±inf, refused as non-finite downstream
            values = _nested("inputs", raw_inputs).astype(np.float32)
        tensors = [v2.tensor("input", values, "FP32")]
    # Per-sample metadata given as lists in "metadata" become BYTES tensors (object arrays of bytes).
    scalar_params: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, list):
            if k not in rt.metadata_fields:
                continue
            arr = np.empty(len(v), dtype=object)
            arr[:] = [str(e).encode() for e in v]
            tensors.append(Tensor(k, "BYTES", [len(v)], arr))
        else:
            scalar_params[k] = v
    bounds.check_tensors(rt, tensors)
    split = split_inputs(rt, tensors, scalar_params)
    x, meta = _prepare(rt, split)
    if "probabilities" in obj:
        probs = rt.to_probabilities(_nested("probabilities", obj["probabilities"]), "'probabilities'")
    elif "outputs" in obj:
        outs, _ = v2.decode_tensors(obj["outputs"], memoryview(b""), "outputs", max_elements=rt.max_elements)
        probs = output_probabilities(rt, outs, scores_output, "observation")
    else:
        raise ProtocolError("malformed_json", "observation has neither 'probabilities' nor 'outputs'")
    probs = _check_probabilities(rt, probs, x.n)
    return ObserveItem(rid or new_request_id(), x, probs, meta, time.time())


# -- CloudEvents ---------------------------------------------------------------------------------------


@dataclass
class CloudEvent:
    id: str
    kind: str  # REQUEST or RESPONSE
    data: bytes


def parse_cloudevent(headers: Mapping[str, str], body: bytes) -> CloudEvent | None:
    """A CloudEvent in binary (``ce-*`` headers) or structured mode, or ``None`` if the body is not one."""
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    if "ce-type" in headers or "ce-id" in headers:
        ce_id, ce_type, data = headers.get("ce-id"), headers.get("ce-type", ""), body
    elif ctype == "application/cloudevents+json":
        try:
            env = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ProtocolError("cloudevent", "structured CloudEvent is not valid JSON") from None
        if not isinstance(env, dict):
            raise ProtocolError("cloudevent", "structured CloudEvent must be a JSON object")
        ce_id, ce_type = env.get("id"), str(env.get("type", ""))
        if "data_base64" in env:
            try:
                data = base64.b64decode(str(env["data_base64"]), validate=True)
            except ValueError:
                raise ProtocolError("cloudevent", "CloudEvent data_base64 is not base64") from None
        else:
            data = json.dumps(env.get("data")).encode()
    else:
        return None
    if not ce_id or not isinstance(ce_id, str):
        raise ProtocolError("cloudevent", "CloudEvent has no id (ce-id)")
    v2.check_request_id(ce_id, "the CloudEvent's id (ce-id)")
    t = ce_type.lower()
    if t.endswith("response") or ".response" in t:
        kind = RESPONSE
    elif t.endswith("request") or ".request" in t:
        kind = REQUEST
    else:
        raise ProtocolError("cloudevent", f"CloudEvent type {ce_type!r} is neither an inference request nor a response")
    return CloudEvent(ce_id, kind, data)


def decode_request_event(
    rt: Runtime, data: bytes, bounds: MetadataBounds | None = None
) -> tuple[Inputs, dict[str, Any] | None]:
    """The logged inference request (V2 ``inputs`` or V1 ``instances``) → prepared inputs, metadata."""
    obj, _ = v2.split_body(data, None)
    if "instances" in obj:  # V1: the instances of a single-input model
        name = rt.signature.names[0] if rt.signature.single is not None else "input"
        split = split_inputs(rt, [v2.tensor(name, _nested("instances", obj["instances"]).astype(np.float32))], {})
    else:
        req = v2.decode_request(data, max_elements=rt.max_elements)
        (bounds or MetadataBounds()).check_tensors(rt, req.inputs)
        split = split_inputs(rt, req.inputs, req.parameters)
    return _prepare(rt, split)


def decode_response_event(rt: Runtime, data: bytes, scores_output: str | None) -> np.ndarray:
    """The logged inference response (V2 ``outputs`` or V1 ``predictions``) → probabilities."""
    obj, _ = v2.split_body(data, None)
    if "predictions" in obj:
        return rt.to_probabilities(_nested("predictions", obj["predictions"]), "'predictions'")
    resp = v2.decode_response(data)
    return output_probabilities(rt, resp.outputs, scores_output, "response event")


def size_of(value: Any) -> int:
    """Bytes a decoded event holds: its arrays (object arrays: their byte strings too) and scalars."""
    if isinstance(value, np.ndarray):
        n = value.nbytes
        if value.dtype.kind == "O":
            n += sum(len(e) if isinstance(e, bytes | str) else 8 for e in value.reshape(-1).tolist())
        return n
    if isinstance(value, tuple | list):
        return sum(size_of(v) for v in value)
    if isinstance(value, Mapping):  # a dict, or a batch of named inputs
        return sum(len(str(k)) + size_of(value[k]) for k in value)
    if isinstance(value, bytes | str):
        return len(value)
    return 8


@dataclass
class _Half:
    kind: str
    value: Any
    t: float
    size: int


class EventPairer:
    """Pairs request and response events by id.

    Bounded in events (``capacity``: the oldest is evicted), in bytes (``max_bytes``: an event that
    would pass it is refused, since evicting could not make room for a flood of large ones without
    losing every pair) and in time (entries expire after ``ttl`` seconds).
    """

    def __init__(self, ttl_seconds: float, capacity: int, max_bytes: int = 64 * _MiB) -> None:
        self.ttl = ttl_seconds
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._pending: OrderedDict[str, _Half] = OrderedDict()
        self.bytes = 0
        self.expired = 0
        self.evicted = 0
        self.duplicates = 0
        self.overflow = 0

    def __len__(self) -> int:
        return len(self._pending)

    def _drop(self, key: str) -> _Half:
        half = self._pending.pop(key)
        self.bytes -= half.size
        return half

    def expire(self, now: float) -> int:
        """Drop entries older than the TTL; returns how many."""
        n = 0
        while self._pending:
            key, half = next(iter(self._pending.items()))
            if now - half.t < self.ttl:
                break
            self._drop(key)
            n += 1
        self.expired += n
        return n

    def _refuse(self, ce_id: str, size: int, now: float) -> PendingFull:
        self.overflow += 1
        if size > self.max_bytes:
            return PendingFull(
                f"event {ce_id}: {size} bytes decoded, more than observe.max_pending_bytes ({self.max_bytes}) "
                "lets wait for a pair",
                status=413,
                reason="observe_event_too_large",
            )
        oldest = next(iter(self._pending.values()), None)
        wait = max(1, math.ceil(self.ttl - (now - oldest.t))) if oldest is not None else 1
        return PendingFull(
            f"event {ce_id}: {len(self._pending)} events ({self.bytes} bytes) wait for their pair; "
            f"{size} more bytes would pass observe.max_pending_bytes ({self.max_bytes}); retry in {wait} s",
            headers={"Retry-After": str(wait)},
        )

    def add(self, ce_id: str, kind: str, value: Any, now: float, size: int = 0) -> tuple[Any, Any] | None:
        """Store one half of ``size`` bytes; when its pair is here, return ``(request_value, response_value)``.

        Raises :class:`PendingFull` (nothing stored) when the half would pass ``max_bytes``."""
        self.expire(now)
        other = self._pending.get(ce_id)
        if other is not None and other.kind != kind:
            self._drop(ce_id)
            return (value, other.value) if kind == REQUEST else (other.value, value)
        freed = other.size if other is not None else 0
        if self.bytes - freed + size > self.max_bytes:
            raise self._refuse(ce_id, size, now)
        if other is not None:
            self.duplicates += 1  # the newer half replaces it, in place (its age and order kept)
            self._pending[ce_id] = _Half(kind, value, other.t, size)
            self.bytes += size - other.size
            return None
        if len(self._pending) >= self.capacity:
            self._drop(next(iter(self._pending)))
            self.evicted += 1
        self._pending[ce_id] = _Half(kind, value, now, size)
        self.bytes += size
        return None

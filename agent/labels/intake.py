"""Delayed labels coming in: a ``POST /v1/labels`` body parsed, its labels joined to their stored
predictions, and the labeling sample listed for whoever labels (``GET /v1/labels/requests``). Nothing
here knows HTTP: a body is bytes, a mistake a :class:`~agent.errors.ClientError`.

* ``{"labels": [{"id": "<request id>:<i>", "label": 3 | "cat" | "__none__"}, ...]}`` →
  ``{"accepted": n, "unknown": n, "duplicate": n, "corrected": n, "invalid": n, "problems": [...]}``. A
  label is a class index, a class name, or ``"__none__"`` for an input of none of the model's classes
  (:mod:`agent.core.label_values`: a wrong prediction, reported as its own realized share). Unknown ids
  (never seen, evicted) and invalid entries are counted, never fatal; at most ``labels.max_batch`` labels
  per body. A label of an already labeled prediction is a ``duplicate`` (the first label stays) unless its
  sender may correct labels (an authorized labeler, with ``ICOS_AGENT_LABELS_TOKEN`` set): then the newer
  label replaces the older (``corrected``) and the estimates follow. Every label is stored with its source and time;
  no source weighs more than ``labels.max_source_share`` of a window's realized figures
  (:mod:`agent.labels.source_cap`).
* A label whose prediction was answered a moment ago may find it still on its way to the store (in
  the judge queue or the store's write queue). The judge queue and the store say which requests they
  still hold, and the label waits for those, bounded by ``labels.commit_timeout_seconds``
  (:meth:`~agent.labels.store.PredictionStore.wait_written`), instead of draining them itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from agent.config.settings import LabelsConfig
from agent.core.label_values import NONE_LABEL, none_label_index
from agent.errors import ClientError
from agent.judging.runtime import Runtime
from agent.labels.kept_inputs import KeptMap
from agent.labels.rows import LabelOutcome, split_prediction_id
from agent.labels.store import PredictionStore
from agent.protocol.inference import MAX_REQUEST_ID_BYTES
from exporters.label_metrics import LabelMetrics

#: The longest prediction id a label may name: a request id (bounded by the decoders) and an index.
MAX_ID_LENGTH = MAX_REQUEST_ID_BYTES + 21
MAX_PROBLEMS = 20


class CurrentRuntime(Protocol):
    """What reads the runtime being served (:class:`agent.dataplane.runtimes.RuntimeHolder`)."""

    @property
    def current(self) -> Runtime:
        """The runtime requests are served with now."""


class PendingJudgement(Protocol):
    """Where judged predictions wait before they reach the store (:class:`agent.judging.queue.JudgeQueue`)."""

    def holds(self, request_id: str) -> bool:
        """Whether a work of ``request_id`` is queued or being recorded."""

    def held_ids(self) -> list[str]:
        """The request ids of every work queued or being recorded now."""

    def wake(self, hurry: bool = False) -> None:
        """Record what is pending (``hurry``: now rather than after lingering)."""


def resolve_label(value: object, classes: list[str]) -> int | None:
    """A class index from a label given as an index (``3``) or a class name (``"cat"``, ``"3"``);
    :data:`~agent.core.label_values.NONE_INDEX` for ``"__none__"`` (none of the model's classes)."""
    k = len(classes)
    none = none_label_index(value, classes)
    if none is not None:
        return none
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return value if 0 <= value < k else None
    if isinstance(value, str):
        if value in classes:
            return classes.index(value)
        text = value.strip()
        if text.isdigit() and int(text) < k:
            return int(text)
    return None


@dataclass
class ParsedLabels:
    labels: list[tuple[str, int]]
    invalid: int
    duplicate_in_request: list[str]
    problems: list[dict[str, Any]]


def parse_labels(obj: object, classes: list[str], max_batch: int) -> ParsedLabels:
    """Validate a ``POST /v1/labels`` body; raises ``ValueError`` for a body that is not a label list."""
    if not isinstance(obj, dict) or not isinstance(obj.get("labels"), list):
        raise ValueError('the body must be a JSON object {"labels": [{"id": "...", "label": ...}, ...]}')
    entries = obj["labels"]
    if len(entries) > max_batch:
        raise OverflowError(f"{len(entries)} labels in one request; the limit is {max_batch} (labels.max_batch)")
    seen: set[str] = set()
    out = ParsedLabels([], 0, [], [])

    def problem(i: int, pid: object, error: str) -> None:
        if len(out.problems) < MAX_PROBLEMS:
            out.problems.append({"index": i, "id": pid if isinstance(pid, str) else None, "error": error})

    for i, e in enumerate(entries):
        pid = e.get("id") if isinstance(e, dict) else None
        if not isinstance(e, dict) or not isinstance(pid, str) or not pid or len(pid) > MAX_ID_LENGTH:
            out.invalid += 1
            # the id is echoed in the answer's problems only when it has a prediction id's size
            problem(
                i,
                pid if isinstance(pid, str) and len(pid) <= MAX_ID_LENGTH else None,
                f"needs an 'id': a prediction id string of 1 to {MAX_ID_LENGTH} characters",
            )
            continue
        label = resolve_label(e.get("label"), classes)
        if label is None:
            out.invalid += 1
            problem(
                i,
                pid,
                f"'label' {e.get('label')!r} is neither a class index 0..{len(classes) - 1}, a class name nor "
                f"{NONE_LABEL!r} (none of the model's classes)",
            )
            continue
        if pid in seen:
            out.duplicate_in_request.append(pid)
            problem(i, pid, "duplicate: this id appears earlier in the request")
            continue
        seen.add(pid)
        out.labels.append((pid, label))
    return out


def decode_labels_body(body: bytes, classes: list[str], max_batch: int) -> ParsedLabels:
    """A ``POST /v1/labels`` body parsed, or the :class:`ClientError` naming what is wrong with it."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ClientError("labels body is not valid JSON", status=400, reason="malformed_json") from None
    except RecursionError:
        raise ClientError("labels body is nested too deeply", status=400, reason="malformed_json") from None
    try:
        return parse_labels(obj, classes, max_batch)
    except OverflowError as exc:
        raise ClientError(str(exc), status=413, reason="too_large") from None
    except ValueError as exc:
        raise ClientError(str(exc), status=400, reason="malformed_json") from None


class LabelIntake:
    """Labels into the prediction store; accepted ones go on to ``on_accepted`` (the realized windows,
    the recalibration trigger)."""

    def __init__(
        self,
        config: LabelsConfig,
        store: PredictionStore,
        runtimes: CurrentRuntime,
        pending: PendingJudgement,
        metrics: LabelMetrics,
        run_in_thread: Callable[..., Awaitable[Any]],
        on_accepted: Callable[[LabelOutcome], None],
        on_labeled: Callable[[list[tuple[str, int]], LabelOutcome], object] | None = None,
        worth: Callable[[list[str]], list[float | None]] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.runtimes = runtimes
        self.pending = pending
        self.metrics = metrics
        self.run = run_in_thread
        self.on_accepted = on_accepted
        #: sees every applied label with what the store did with it (stratified draws learn from the accepted
        #: ones, a challenger's drawn disagreements get their outcome)
        self.on_labeled = on_labeled
        #: how much each sampled prediction's label is worth (stratified draws), what the listing is ordered by
        self.worth = worth

    async def accept(self, body: bytes, source: str, correct: bool = False) -> dict[str, Any]:
        """Apply a ``POST /v1/labels`` body from ``source`` (``correct``: its labels replace earlier ones);
        raises :class:`ClientError` for a body that is not a label list,
        :class:`~agent.labels.store.StoreUnavailable` when the store cannot be written."""
        parsed: ParsedLabels = await self.run(
            decode_labels_body, body, self.runtimes.current.classes, self.config.max_batch
        )
        outcome: LabelOutcome = await self.run(self._apply, parsed.labels, source, correct)
        if outcome.unknown:
            outcome = await self._retry_on_their_way(parsed.labels, outcome, source, correct)
        counts = {
            "accepted": outcome.n_accepted - len(outcome.corrected),
            "unknown": len(outcome.unknown),
            "duplicate": len(outcome.duplicate) + len(parsed.duplicate_in_request),
            "corrected": len(outcome.corrected),
            "invalid": parsed.invalid,
        }
        self.metrics.count_labels(counts)
        problems = list(parsed.problems)
        for kind, ids in (("unknown", outcome.unknown), ("duplicate", outcome.duplicate)):
            for pid in ids[: max(0, MAX_PROBLEMS - len(problems))]:
                text = "no stored prediction has this id" if kind == "unknown" else "already labeled"
                problems.append({"id": pid, "error": f"{kind}: {text}"})
        return {**counts, "problems": problems}

    def _apply(self, labels: list[tuple[str, int]], source: str, correct: bool) -> LabelOutcome:
        outcome = self.store.apply_labels(labels, time.time(), source, correct)
        if outcome.n_accepted:
            self.on_accepted(outcome)
            if self.on_labeled is not None:
                self.on_labeled(labels, outcome)
        return outcome

    async def _retry_on_their_way(
        self, labels: list[tuple[str, int]], first: LabelOutcome, source: str, correct: bool
    ) -> LabelOutcome:
        """Labels of predictions still on their way to the store, applied once they are there.

        Every unknown label is tried once more, not only those whose request is still on its way: a
        prediction written between the first try and the look at what is on its way is in the store by
        then, and no longer on its way (the second try costs one more lookup of the unknown ids)."""
        unknown = set(first.unknown)
        by_request = {pid: split_prediction_id(pid)[0] for pid in unknown}
        on_their_way = {rid for rid in set(by_request.values()) if self._on_their_way(rid)}
        if on_their_way:
            await self._wait(on_their_way)
        again = [(pid, lab) for pid, lab in labels if pid in unknown]
        second: LabelOutcome = await self.run(self._apply, again, source, correct)
        return LabelOutcome(
            accepted=[*first.accepted, *second.accepted],
            n_accepted=first.n_accepted + second.n_accepted,
            unknown=second.unknown,
            duplicate=[*first.duplicate, *second.duplicate],
            corrected=[*first.corrected, *second.corrected],
        )

    def _on_their_way(self, request_id: str) -> bool:
        return self.pending.holds(request_id) or self.store.holds(request_id)

    async def _wait(self, request_ids: Iterable[str]) -> None:
        self.pending.wake(hurry=True)
        await self.store.wait_written(request_ids, self.pending.holds, self.config.commit_timeout_seconds)

    async def requests(self, limit: int, inputs: bool = False) -> dict[str, Any]:
        """``GET /v1/labels/requests``: the newest predictions of the labeling sample without a label
        (those answered a moment ago included: what is on its way to the store is waited for); under
        stratified draws, the ``limit`` most worth labeling of the :data:`WORTH_CANDIDATES` times as many
        newest, most worth first, each with its ``worth`` (``order: worth``). With
        ``inputs``, each carries its kept inputs, predicted class and its probability (``inputs`` null
        where none were kept), and the listing stops before :data:`MAX_INPUTS_LISTING_BYTES` of inputs
        (``truncated``)."""
        await self._wait({*self.pending.held_ids(), *self.store.unwritten_ids()})
        rt = self.runtimes.current
        wide = limit * WORTH_CANDIDATES if self.worth is not None else limit
        rows: list[tuple[str, float]] = await self.run(self.store.label_requests, rt.identity, wide)
        entries: list[dict[str, Any]] = [{"id": pid, "timestamp": ts} for pid, ts in rows]
        out: dict[str, Any] = {"sample_rate": self.config.sample_rate, "sampling": self.config.sampling}
        if self.worth is not None:
            entries = by_worth(entries, self.worth([e["id"] for e in entries]))[:limit]
            rows = [(e["id"], e["timestamp"]) for e in entries]
            out["order"] = "worth"
        if inputs:
            kept: KeptMap = await self.run(self.store.kept_inputs, [pid for pid, _ in rows])
            entries, truncated = with_inputs(entries, kept, rt.classes)
            out.update(classes=list(rt.classes), keep_sampled_inputs=self.config.keep_sampled_inputs)
            out["truncated"] = truncated
        return {**out, "n": len(entries), "requests": entries}


#: Under stratified draws the listing picks the ``limit`` most worth labeling among this many times as many.
WORTH_CANDIDATES = 4


def by_worth(entries: list[dict[str, Any]], worth: list[float | None]) -> list[dict[str, Any]]:
    """``entries`` with their ``worth``, most worth first (those of unknown worth last, newest first as
    listed)."""
    scored = [{**e, "worth": w} for e, w in zip(entries, worth, strict=True)]
    return sorted(scored, key=lambda e: (e["worth"] is None, -(e["worth"] or 0.0)))


#: A listing with inputs stops before this many bytes of encoded inputs, whatever its ``limit``.
MAX_INPUTS_LISTING_BYTES = 16 << 20


def with_inputs(entries: list[dict[str, Any]], kept: KeptMap, classes: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """The listing's entries with their kept inputs, cut before :data:`MAX_INPUTS_LISTING_BYTES`."""
    out: list[dict[str, Any]] = []
    size = 0
    for e in entries:
        got = kept.get(e["id"])
        if got is None:
            out.append({**e, **dict.fromkeys(("predicted", "confidence", "inputs"))})  # none kept
            continue
        k, confidence, data = got
        size += len(data)
        if size > MAX_INPUTS_LISTING_BYTES:
            return out, True
        name = classes[k] if 0 <= k < len(classes) else str(k)
        out.append({**e, "predicted": name, "confidence": confidence, "inputs": json.loads(data)})
    return out, False

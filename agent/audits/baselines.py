"""Baselines of audit results: the value an alert compares later runs with, so that a model is judged
against itself rather than against one threshold for every model (the shipped demo CNN's D-Score is
0.65; a fixed 0.8 would alert on it forever).

A kind's baseline gauge (``GaugeSpec.baseline``, e.g. ``icos_dscore``) has, per *identity* (the model
and the audit's parameters and data setting: another model or another grid measures something else),
the value configured in ``audits.baselines.<kind>``, else the first successful run's. Learnt values
are kept in the state directory's document store when there is one, so a restart does not make the
next run, degraded or not, the new baseline; without a state directory they last as long as the
process. A non-finite value is never learnt.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agent.core import logs

log = logs.get("audits")

#: Identities kept per model in the store (a model swapped back and forth keeps its baseline).
MAX_IDENTITIES = 32


class DocumentStore(Protocol):
    """Where learnt baselines are kept (the agent's state store)."""

    def get_json(self, key: str, check: Callable[[Any], object] | None = None, what: str = "document") -> Any: ...

    def put_json(self, key: str, value: Any) -> None: ...


def _check(doc: Any) -> None:
    if not isinstance(doc, dict) or not all(
        isinstance(v, dict) and all(isinstance(x, int | float) for x in v.values()) for v in doc.values()
    ):
        raise ValueError("not a baselines document: {identity: {gauge: number}}")


class AuditBaselines:
    """Configured and learnt baselines of one model name's audits.

    ``configured`` maps a gauge name to its configured baseline; ``store()`` gives the document
    store (``None`` without one, or while it cannot be opened).
    """

    def __init__(
        self, model_name: str, configured: Mapping[str, float], store: Callable[[], DocumentStore | None]
    ) -> None:
        self.key = f"audit-baselines:{model_name}"
        self.configured = dict(configured)
        self.store = store
        self._learnt: dict[str, dict[str, float]] = {}
        self._read = False
        self._lock = threading.Lock()

    def _load(self) -> dict[str, dict[str, float]]:
        """The learnt baselines, merged once with the store's as soon as it is open (the caller holds
        the lock; a value the store already has wins over one learnt before it opened)."""
        if not self._read:
            store = self.store()
            if store is not None:
                doc = store.get_json(self.key, _check, "document") or {}
                before = {k: dict(v) for k, v in self._learnt.items()}
                for identity, values in doc.items():
                    self._learnt.setdefault(identity, {}).update({g: float(x) for g, x in values.items()})
                self._read = True
                if any(g not in doc.get(k, {}) for k, v in before.items() for g in v):
                    self._save(store)  # learnt while the store could not be opened
        return self._learnt

    def _save(self, store: DocumentStore) -> None:
        """Write the learnt baselines (the caller holds the lock); a failure leaves them in memory."""
        try:
            store.put_json(self.key, {k: dict(v) for k, v in self._learnt.items()})
        except Exception as exc:  # a full or read-only state directory
            log.warning("audit baseline not saved", extra={"error": f"{type(exc).__name__}: {exc}"})

    def get(self, gauge: str, identity: str) -> float | None:
        """The baseline of ``gauge`` for ``identity``: configured, else learnt, else ``None``."""
        if gauge in self.configured:
            return self.configured[gauge]
        with self._lock:
            return self._load().get(identity, {}).get(gauge)

    def learn(self, gauge: str, identity: str, value: float | None) -> None:
        """Keep ``value`` as the baseline of ``gauge`` for ``identity`` unless one is known already."""
        if value is None or not math.isfinite(value) or gauge in self.configured:
            return
        with self._lock:
            learnt = self._load()
            if gauge in learnt.get(identity, {}):
                return
            learnt.setdefault(identity, {})[gauge] = float(value)
            while len(learnt) > MAX_IDENTITIES:
                del learnt[next(iter(learnt))]
            store = self.store()
            if store is not None:
                self._save(store)
        log.info("audit baseline learnt", extra={"gauge": gauge, "baseline": value, "identity": identity})

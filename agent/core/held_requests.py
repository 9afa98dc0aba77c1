"""Requests held on their way to the prediction store, counted by request id.

The challenger's queue, the judge queue and the store's write queue each hold batches of a request
for a moment, and the label intake asks each whether a request is still held (so a label waits for
its prediction instead of missing it). One count serves all three. Not locked: its owner guards it
with the lock that guards the owner's queue, so a batch is counted together with being queued.
"""

from __future__ import annotations

from collections import Counter


class HeldRequests:
    """Batches held per request id (the owner's lock guards every call)."""

    def __init__(self) -> None:
        self._count: Counter[str] = Counter()

    def add(self, request_id: str) -> None:
        """A batch of ``request_id`` is held."""
        count = self._count
        count[request_id] = count.get(request_id, 0) + 1  # without Counter's __missing__ (the request path)

    def release(self, request_id: str) -> bool:
        """A batch of ``request_id`` is no longer held; True when it was the request's last."""
        left = self._count[request_id] - 1
        if left > 0:
            self._count[request_id] = left
            return False
        self._count.pop(request_id, None)
        return True

    def holds(self, request_id: str) -> bool:
        """Whether batches of ``request_id`` are held."""
        return self._count.get(request_id, 0) > 0

    def ids(self) -> list[str]:
        """The request ids of every batch held."""
        return list(self._count)

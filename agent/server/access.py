"""Bearer tokens and the throttle on guessing them.

Two tokens guard the agent's endpoints, both read from the environment only: the admin token
(``ICOS_AGENT_ADMIN_TOKEN``: reload, audits, recalibration, dropping labels) and the labelers' token
(``ICOS_AGENT_LABELS_TOKEN``: the labeling sample and posting labels; the admin token is accepted there
too). Tokens are compared in constant time and never logged.

A client (by its address) that presents a wrong or missing token :data:`MAX_FAILURES` times within
:data:`WINDOW_SECONDS` is answered 429 with ``Retry-After`` until the oldest of those failures leaves the
window, before its token is even looked at: guessing costs a minute per few tries. Every refusal is a
:class:`~agent.errors.ClientError`, counted in ``icos_invalid_requests_total{reason}`` (``unauthorized``,
``forbidden``, ``auth_throttled``). At most :data:`MAX_CLIENTS` clients are remembered (the oldest
forgotten first), so the throttle's memory is bounded whatever the number of addresses.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import OrderedDict, deque

from agent.errors import ClientError

MAX_FAILURES = 5
WINDOW_SECONDS = 60.0
MAX_CLIENTS = 10_000


class FailureThrottle:
    """Recent token failures per client (thread-safe, bounded)."""

    def __init__(self, max_failures: int = MAX_FAILURES, window: float = WINDOW_SECONDS) -> None:
        self.max_failures = max_failures
        self.window = window
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times

    def check(self, client: str) -> None:
        """Refuse (429) a client that failed too often in the last window."""
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            if times is None or len(times) < self.max_failures:
                return
            wait = max(1, math.ceil(times[0] + self.window - now))
        raise ClientError(
            f"too many failed tokens from this client; retry in {wait} s",
            status=429,
            reason="auth_throttled",
            headers={"Retry-After": str(wait)},
        )

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            if times is None:
                times = self._failures[client] = deque(maxlen=self.max_failures)
            self._failures.move_to_end(client)
            times.append(now)
            while len(self._failures) > MAX_CLIENTS:
                self._failures.popitem(last=False)


def bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None when absent or of another scheme)."""
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def matches(token: str, expected: str | None) -> bool:
    """Constant-time comparison (False when no token is configured)."""
    return expected is not None and hmac.compare_digest(token.encode(), expected.encode())


class TokenGate:
    """Checks a request's bearer token against named tokens; the name of the one it matched is who sent
    it (e.g. a label's source)."""

    def __init__(self, tokens: dict[str, str | None], throttle: FailureThrottle) -> None:
        self.tokens = {name: t for name, t in tokens.items() if t is not None}
        self.throttle = throttle

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def check(self, authorization: str, client: str) -> str:
        """The name of the token the header carries; 401 without one, 403 for a wrong one, 429 for a
        client that failed too often."""
        self.throttle.check(client)
        token = bearer(authorization)
        if token is None:
            self.throttle.failed(client)
            raise ClientError("missing bearer token (Authorization: Bearer <token>)", status=401, reason="unauthorized")
        for name, expected in self.tokens.items():
            if matches(token, expected):
                return name
        self.throttle.failed(client)
        raise ClientError("invalid bearer token", status=403, reason="forbidden")

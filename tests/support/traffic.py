"""Concurrent clients for prediction-store tests: they record which prediction ids the agent
acknowledged (and when), in serve mode (``/v2/.../infer``) or observe mode (``/v1/observe``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from agent.dataplane.admission import prediction_ids


@dataclass
class Acknowledged:
    """Prediction ids answered 2xx, per client in order, with the monotonic time of each answer."""

    ids: list[list[str]]
    times: list[list[float]]
    refused: dict[int, int] = field(default_factory=dict)  # status -> count of non-2xx answers
    lock: threading.Lock = field(default_factory=threading.Lock)

    def all_ids(self) -> list[str]:
        return [i for per in self.ids for i in per]


class Clients:
    """``n`` client threads sending small requests with unique ids until stopped (bounded in count
    and time); connection errors (the agent killed) end a client quietly."""

    def __init__(
        self,
        url: str,
        mode: str,
        x: np.ndarray,
        probs: np.ndarray,
        n: int = 4,
        per_request: int = 2,
        prefix: str = "c",
        max_requests: int = 2000,
        max_seconds: float = 60.0,
    ) -> None:
        self.url, self.mode, self.x, self.probs = url, mode, x, probs
        self.per_request, self.prefix = per_request, prefix
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.stop = threading.Event()
        self.acked = Acknowledged([[] for _ in range(n)], [[] for _ in range(n)])
        self.threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(n)]

    def _body(self, rid: str, rows: np.ndarray) -> tuple[str, dict[str, object]]:
        x = self.x[rows]
        if self.mode == "observe":
            return "/v1/observe", {"id": rid, "inputs": x.tolist(), "probabilities": self.probs[rows].tolist()}
        inputs = [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
        return "/v2/models/mnist/infer", {"id": rid, "inputs": inputs, "outputs": [{"name": "label"}]}

    def _ids(self, answer: dict[str, object]) -> list[str]:
        if self.mode == "observe":
            return prediction_ids(str(answer["id"]), int(answer["accepted"]))  # type: ignore[call-overload]
        return prediction_ids(str(answer["id"]), int(answer["parameters"]["icos_prediction_count"]))  # type: ignore[index]

    def _run(self, c: int) -> None:
        deadline = time.monotonic() + self.max_seconds
        with httpx.Client(timeout=30) as http:
            for k in range(self.max_requests):
                if self.stop.is_set() or time.monotonic() > deadline:
                    return
                rows = (np.arange(self.per_request) + (c * 7919 + k * self.per_request)) % len(self.x)
                path, body = self._body(f"{self.prefix}{c}-{k}", rows)
                try:
                    r = http.post(self.url + path, json=body)
                except httpx.HTTPError:
                    return  # the agent is gone
                if r.status_code in (200, 202):
                    ids = self._ids(r.json())
                    with self.acked.lock:
                        self.acked.ids[c] += ids
                        self.acked.times[c] += [time.monotonic()] * len(ids)
                else:
                    with self.acked.lock:
                        self.acked.refused[r.status_code] = self.acked.refused.get(r.status_code, 0) + 1

    def start(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def count(self) -> int:
        with self.acked.lock:
            return sum(len(i) for i in self.acked.ids)

    def join(self, timeout: float = 60.0) -> None:
        """Stop the clients and wait for them."""
        self.stop.set()
        self.finish(timeout)

    def finish(self, timeout: float = 120.0) -> None:
        """Wait for the clients to send all their requests."""
        for t in self.threads:
            t.join(timeout)

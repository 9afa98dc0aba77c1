"""The demo's HTTP client of the agent: V2 inference with binary tensors, estimates, audits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from agent.dataplane.admission import PREDICTION_COUNT, prediction_ids
from agent.errors import UserError
from agent.protocol import v2

VERDICT_NAMES = ("pass", "fail:idi", "fail:tdi", "fail:adi")


@dataclass(frozen=True)
class InferResult:
    """Labels, verdicts and the per-sample prediction ids of one inference request."""

    labels: np.ndarray
    verdicts: list[str]
    prediction_ids: list[str]


class AgentClient:
    """Talks to a running agent at ``url`` (``token``: the admin bearer token for audits)."""

    def __init__(self, url: str, model: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.token = token
        self.http = httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def infer(self, x: np.ndarray, request_id: str) -> InferResult:
        """One V2 inference request, input and outputs as binary tensors."""
        body, headers = v2.encode_request(
            [v2.tensor("input", np.ascontiguousarray(x, dtype=np.float32), "FP32")],
            binary=True,
            request_id=request_id,
            outputs=[v2.RequestedOutput("label", True), v2.RequestedOutput("icos_verdict", True)],
        )
        r = self.http.post(f"/v2/models/{self.model}/infer", content=body, headers=headers)
        if r.status_code != 200:
            raise UserError(f"the agent answered {r.status_code} to an inference request: {r.text[:300]}")
        resp = v2.decode_response(r.content, r.headers.get(v2.HEADER_LENGTH))
        label_t = resp.output("label")
        verdict_t = resp.output("icos_verdict")
        if label_t is None or verdict_t is None:
            raise UserError("the agent's response lacks the label or icos_verdict output")
        verdicts = [v.decode() if isinstance(v, bytes) else str(v) for v in verdict_t.data.reshape(-1).tolist()]
        ids = prediction_ids(resp.id or request_id, int(resp.parameters.get(PREDICTION_COUNT, 0)))
        return InferResult(np.asarray(label_t.data, dtype=np.int64).reshape(-1), verdicts, ids)

    def post_labels(self, ids: list[str], labels: np.ndarray) -> dict[str, Any]:
        """``POST /v1/labels``: the true class of earlier predictions, by prediction id."""
        body = {"labels": [{"id": i, "label": int(y)} for i, y in zip(ids, labels.tolist(), strict=True)]}
        r = self.http.post("/v1/labels", json=body)
        if r.status_code != 200:
            raise UserError(f"the agent answered {r.status_code} to POST /v1/labels: {r.text[:300]}")
        out: dict[str, Any] = r.json()
        return out

    def estimates(self) -> dict[str, Any]:
        r = self.http.get("/v1/estimates")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def run_audit(self, kind: str, timeout: float = 600.0) -> dict[str, Any]:
        """``POST /v1/audits/{kind}?wait=true``: the finished audit as the agent reports it."""
        r = self.http.post(f"/v1/audits/{kind}", params={"wait": "true"}, headers=self._admin(), timeout=timeout)
        if r.status_code != 200:
            raise UserError(f"the {kind} audit request failed ({r.status_code}): {r.text[:300]}")
        out: dict[str, Any] = r.json()
        return out

    def has_path(self, method: str, path: str) -> bool:
        """Whether the agent's OpenAPI document declares ``method path`` (for optional features)."""
        try:
            doc = self.http.get("/openapi.json").json()
        except (httpx.HTTPError, ValueError):
            return False
        return method.lower() in (doc.get("paths", {}).get(path) or {})

    def metrics_text(self) -> str:
        r = self.http.get("/metrics")
        r.raise_for_status()
        return r.text

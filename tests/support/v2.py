"""Open Inference Protocol V2 for the tests: request bodies, KServe inference-logger CloudEvents, and
the agent's JSON endpoints (inference, estimates, labels) called over HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np

from agent.dataplane.admission import prediction_ids

INFER = "/v2/models/mnist/infer"
REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"


def infer_body(
    x: np.ndarray, outputs: tuple[str, ...] | None = None, rid: str | None = None, **parameters: Any
) -> dict[str, Any]:
    """A JSON V2 request for the MNIST CNN's ``input`` (FP32); ``outputs`` named when given,
    ``parameters`` (IDI metadata such as ``form``) when given."""
    body: dict[str, Any] = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
    }
    if rid is not None:
        body["id"] = rid
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    if parameters:
        body["parameters"] = parameters
    return body


def verdict_body(x: np.ndarray) -> dict[str, Any]:
    """A request asking for the label and the verdicts (judged before the answer)."""
    return infer_body(x, ("label", "icos_verdict"))


def infer(url: str, x: np.ndarray, rid: str, outputs: tuple[str, ...]) -> dict[str, Any]:
    """POST a JSON request; its prediction ids and the outputs as arrays (asserts a 200)."""
    r = httpx.post(f"{url}{INFER}", json=infer_body(x, outputs, rid), timeout=30)
    assert r.status_code == 200, r.text
    return decoded_answer(r.json())


def decoded_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """A JSON inference answer's prediction ids and its outputs as arrays."""
    res: dict[str, Any] = {"ids": prediction_ids(answer["id"], answer["parameters"]["icos_prediction_count"])}
    for t in answer["outputs"]:
        res[t["name"]] = np.asarray(t["data"]).reshape(t["shape"])
    return res


def send_traffic(url: str, x: np.ndarray, batch: int = 100, prefix: str = "req") -> dict[str, np.ndarray]:
    """``x`` in batches; every batch asks for the verdicts (judged inline) but the last (judged off the path)."""
    ids, probs, labels, verdicts = [], [], [], []
    for k, start in enumerate(range(0, len(x), batch)):
        last = start + batch >= len(x)
        outputs = ("probabilities", "label") if last else ("probabilities", "label", "icos_verdict")
        res = infer(url, x[start : start + batch], f"{prefix}-{k}", outputs)
        ids += res["ids"]
        probs.append(res["probabilities"])
        labels.append(res["label"])
        verdicts.append(res.get("icos_verdict", np.array([None] * len(res["ids"]))))
    return {
        "ids": np.asarray(ids),
        "probabilities": np.concatenate(probs).astype(np.float32),
        "labels": np.concatenate(labels),
        "verdicts": np.concatenate(verdicts),
    }


def send_table(
    url: str, model: str, columns: dict[str, np.ndarray], datatypes: dict[str, str], batch: int = 100
) -> int:
    """A table's ``columns`` (one ``[N, 1]`` or ``[N]`` array per model input) in JSON V2 requests of ``batch``
    rows, each input typed by ``datatypes`` (strings as ``BYTES``); asserts every answer is a 200 and returns the
    rows sent."""
    rows = len(next(iter(columns.values())))
    with httpx.Client(timeout=60) as client:
        for start in range(0, rows, batch):
            tensors = []
            for name, datatype in datatypes.items():
                part = np.asarray(columns[name][start : start + batch]).reshape(-1, 1)
                data = [str(v) for v in part.ravel()] if datatype == "BYTES" else part.ravel().tolist()
                tensors.append({"name": name, "datatype": datatype, "shape": list(part.shape), "data": data})
            r = client.post(f"{url}/v2/models/{model}/infer", json={"inputs": tensors})
            assert r.status_code == 200, r.text
    return rows


def post_labels(url: str, entries: list[Any]) -> dict[str, Any]:
    """POST /v1/labels (asserts a 200)."""
    r = httpx.post(f"{url}/v1/labels", json={"labels": entries}, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def estimates(url: str) -> dict[str, Any]:
    """GET /v1/estimates (asserts a 200)."""
    r = httpx.get(f"{url}/v1/estimates", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def judged(url: str) -> int:
    """Predictions judged so far (``total_judged``)."""
    return int(estimates(url)["total_judged"])


def ce_headers(ce_id: str, ce_type: str) -> dict[str, str]:
    """The binary-mode CloudEvents headers KServe's inference logger sends."""
    return {
        "ce-id": ce_id,
        "ce-type": ce_type,
        "ce-specversion": "1.0",
        "ce-source": "http://localhost:9081/",
        "ce-inferenceservicename": "mnist",
        "ce-namespace": "default",
        "ce-component": "predictor",
        "content-type": "application/json",
    }


def v2_request(x: np.ndarray) -> bytes:
    """A logged V2 request body (the inputs)."""
    return json.dumps(
        {
            "id": "r",
            "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        }
    ).encode()


def v2_response(p: np.ndarray) -> bytes:
    """A logged V2 response body (raw scores as ``logits``)."""
    return json.dumps(
        {
            "model_name": "mnist",
            "id": "r",
            "outputs": [{"name": "logits", "shape": list(p.shape), "datatype": "FP32", "data": p.ravel().tolist()}],
        }
    ).encode()

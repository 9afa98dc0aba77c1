"""Observe mode: direct observations and KServe inference-logger CloudEvents, judged off the request path."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from agent.data.datasets import Splits
from agent.model.classifier import OnnxClassifier
from agent.server.composition import Agent
from tests.support.inprocess import RunningServer
from tests.support.metrics import metric
from tests.support.settings import observe_app
from tests.support.v2 import REQUEST_TYPE, RESPONSE_TYPE, ce_headers, judged, v2_request, v2_response
from tests.support.waiting import on_loop, wait_until


def test_direct_observation(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, mnist_model: OnnxClassifier
) -> None:
    srv = run_server(observe_app(mnist_bundle_dir))
    x = mnist_splits.test.x[:20]
    probs = mnist_model.predict(x).probabilities
    r = httpx.post(
        f"{srv.url}/v1/observe",
        json={"id": "obs-1", "inputs": x.tolist(), "probabilities": probs.tolist(), "metadata": {"form": "lines"}},
    )
    assert r.status_code == 202, r.text
    assert r.json() == {"id": "obs-1", "accepted": 20}
    # V2-shaped observation with per-sample metadata
    body = {
        "inputs": [{"name": "pixels", "shape": [5, 784], "datatype": "FP32", "data": x[:5].ravel().tolist()}],
        "outputs": [
            {"name": "probabilities", "shape": [5, 10], "datatype": "FP32", "data": probs[:5].ravel().tolist()}
        ],
        "metadata": {"form": ["lines", "curves", "lines", "curves", "lines"]},
    }
    assert httpx.post(f"{srv.url}/v1/observe", json=body).status_code == 202
    assert wait_until(lambda: judged(srv.url) == 25)
    est = httpx.get(f"{srv.url}/v1/estimates").json()
    assert est["windows"]["5m"]["n"] == 25
    # form == lines allows only 1/4/7: the test images of other digits fail the IDI
    not_147 = int((~np.isin(mnist_model.predict(x).predicted, [1, 4, 7])).sum())
    assert est["windows"]["5m"]["fails_by_family"]["idi"] >= not_147
    # inference itself is not served in observe mode
    r = httpx.post(f"{srv.url}/v2/models/mnist/infer", content=v2_request(x[:1]))
    assert r.status_code == 404 and "observe" in r.json()["error"]


def test_cloudevents_pairs(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, mnist_model: OnnxClassifier
) -> None:
    srv = run_server(observe_app(mnist_bundle_dir))
    x = mnist_splits.test.x[:30]
    logits = np.log(mnist_model.predict(x).probabilities + 1e-9)  # the logger sees raw scores: softmax is applied
    url = f"{srv.url}/v1/observe"
    for i in range(3):
        xs, ls = x[i * 10 : (i + 1) * 10], logits[i * 10 : (i + 1) * 10]
        first, second = (REQUEST_TYPE, RESPONSE_TYPE) if i % 2 == 0 else (RESPONSE_TYPE, REQUEST_TYPE)
        bodies = {REQUEST_TYPE: v2_request(xs), RESPONSE_TYPE: v2_response(ls)}
        r1 = httpx.post(url, content=bodies[first], headers=ce_headers(f"ev-{i}", first))
        assert r1.status_code == 202 and r1.json()["paired"] is False
        r2 = httpx.post(url, content=bodies[second], headers=ce_headers(f"ev-{i}", second))
        assert r2.status_code == 202 and r2.json()["paired"] is True, r2.text
    # structured mode, V1 bodies
    env = {
        "specversion": "1.0",
        "id": "ev-s",
        "source": "x",
        "type": REQUEST_TYPE,
        "data": {"instances": x[:4].tolist()},
    }
    h = {"content-type": "application/cloudevents+json"}
    assert httpx.post(url, content=json.dumps(env), headers=h).status_code == 202
    env = {**env, "type": RESPONSE_TYPE, "data": {"predictions": logits[:4].tolist()}}
    assert httpx.post(url, content=json.dumps(env), headers=h).json()["paired"] is True
    assert wait_until(lambda: judged(srv.url) == 34)
    assert metric(srv.url, "icos_observe_events_total", type="request") == 4
    assert metric(srv.url, "icos_observe_events_total", type="response") == 4
    assert metric(srv.url, "icos_observe_events_unmatched_total") == 0
    # a bad event body is a 400, counted, and never enters the buffer
    r = httpx.post(url, content=b"{", headers=ce_headers("ev-bad", REQUEST_TYPE))
    assert r.status_code == 400
    assert metric(srv.url, "icos_invalid_requests_total", reason="malformed_json") == 1


def test_unmatched_events_counted(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, mnist_model: OnnxClassifier
) -> None:
    # a TTL long enough that three posts finish before it on a loaded machine (the eviction is what is counted)
    srv = run_server(observe_app(mnist_bundle_dir, event_ttl_seconds=5.0, event_buffer=2))
    url = f"{srv.url}/v1/observe"
    x = mnist_splits.test.x[:2]
    req = v2_request(x)
    # three lone requests into a buffer of two: one evicted
    for i in range(3):
        assert httpx.post(url, content=req, headers=ce_headers(f"lone-{i}", REQUEST_TYPE)).status_code == 202
    assert metric(srv.url, "icos_observe_events_unmatched_total", reason="evicted") == 1
    # a duplicate request event for a pending id
    assert httpx.post(url, content=req, headers=ce_headers("lone-2", REQUEST_TYPE)).status_code == 202
    assert metric(srv.url, "icos_observe_events_unmatched_total", reason="duplicate") == 1
    # the two left expire after the TTL
    assert wait_until(lambda: metric(srv.url, "icos_observe_events_unmatched_total", reason="expired") == 2, 30)
    # a response arriving after its request expired stays unmatched (and later expires too)
    resp = v2_response(np.log(mnist_model.predict(x).probabilities))
    r = httpx.post(url, content=resp, headers=ce_headers("lone-1", RESPONSE_TYPE))
    assert r.json()["paired"] is False
    assert judged(srv.url) == 0


def test_queue_full_rejects_with_429(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, mnist_model: OnnxClassifier
) -> None:
    app = observe_app(mnist_bundle_dir, queue_size=3)
    srv = run_server(app)
    svc: Agent = app.state.agent
    assert svc.loop is not None and svc.observe is not None
    on_loop(svc.loop, svc.observe.judging.clear)  # hold the workers: the queue fills up
    x = mnist_splits.test.x[:2]
    body = {"inputs": x.tolist(), "probabilities": mnist_model.predict(x).probabilities.tolist()}
    codes = [httpx.post(f"{srv.url}/v1/observe", json=body).status_code for _ in range(6)]
    # the worker may hold one batch already taken from the queue
    assert codes[:3] == [202, 202, 202] and set(codes[3:]) <= {202, 429} and codes.count(429) >= 2
    r = httpx.post(f"{srv.url}/v1/observe", json=body)
    assert r.status_code == 429 and "queue is full" in r.json()["error"] and r.headers["Retry-After"] == "1"
    rejected = codes.count(429) + 1
    assert metric(srv.url, "icos_observe_rejected_total") == rejected
    on_loop(svc.loop, svc.observe.judging.set)
    accepted = codes.count(202)
    assert wait_until(lambda: judged(srv.url) == 2 * accepted)

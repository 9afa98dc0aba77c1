"""Stratified draws in a served agent (``labels.sampling: stratified``): every drawn prediction keeps its
probability, the labels posted for them teach the allocation (by segment and bin of predicted correctness),
``with_labels`` is the inverse-probability-weighted estimate, covering the window's accuracy, and every
segment of the window shows the realized accuracy of the labels drawn in it; the labeling sample is listed
most worth labeling first."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client import CollectorRegistry

from agent.data.datasets import Splits
from agent.estimation.estimators.prediction_powered import WITH_LABELS
from agent.estimation.estimators.strata import N_BINS
from agent.labels.store import STORE_FILE
from agent.labels.strata_draws import StratifiedDraws
from agent.server.app import create_app
from tests.support.inprocess import RunningServer
from tests.support.settings import stateful_settings
from tests.support.v2 import post_labels, send_traffic
from tests.support.waiting import wait_until


def test_served_agent_under_stratified_draws_learns_from_its_labels(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    labels = {"sampling": "stratified", "per_window": 100_000, "budget_window": "5m"}
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path, labels=labels), CollectorRegistry()))
    agent = srv.app.state.agent
    strata = agent.sample.draw_policy
    assert isinstance(strata, StratifiedDraws) and strata.learnt() == 0.0
    x, y = mnist_splits.test.x[:1000], mnist_splits.test.y[:1000]
    # a third of the digits darkened and noisy: the errors live there
    rng = np.random.default_rng(0)
    x = x.astype(np.float32).copy()
    x[:333] = np.clip(x[:333] * 0.5 + rng.normal(0, 0.2, x[:333].shape), 0, 1)
    traffic = send_traffic(srv.url, x)
    truth = dict(zip(traffic["ids"].tolist(), y.tolist(), strict=True))
    listed = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": 1000}).json()
    assert listed["sampling"] == "stratified"
    ids = [r["id"] for r in listed["requests"]]
    assert 50 < len(ids) < 1000  # how many follows the traffic's measured rate (this machine's speed)
    # the listing is ordered by how much each label is worth, most first
    assert listed["order"] == "worth"
    worth = [r["worth"] for r in listed["requests"]]
    assert worth == sorted(worth, reverse=True) and worth[0] > worth[-1]
    posted = ids[:-50]  # the labelers label the most worth; the least worth stay listed
    post_labels(srv.url, [{"id": pid, "label": truth[pid]} for pid in posted])
    assert strata.learnt() == len(posted)  # every label of a drawn prediction taught the allocation
    again = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": 1000}).json()["requests"]
    assert sorted(r["id"] for r in again) == sorted(ids[-50:])
    assert [r["worth"] for r in again] == sorted((r["worth"] for r in again), reverse=True)
    excess = strata.shrunk_excess()
    assert excess is not None and float(np.abs(excess).max()) > 0
    assert len(excess) > N_BINS  # the bundle's segments are strata too
    # the rest labeled too: the estimate is design-unbiased when the drawn predictions get their labels (a
    # labeler who skips the least-worth ones leaves out mostly right predictions, and the estimate drops)
    post_labels(srv.url, [{"id": pid, "label": truth[pid]} for pid in ids[-50:]])
    posted = ids

    def windows() -> dict[str, Any]:
        return dict(httpx.get(f"{srv.url}/v1/estimates").json()["windows"])

    assert wait_until(lambda: windows()["5m"]["n"] == 1000 and WITH_LABELS in windows()["5m"]["estimates"])
    e = windows()["5m"]["estimates"][WITH_LABELS]
    assert e["weighted"] is True and e["n_labels"] == len(posted)
    accuracy = float(np.mean(traffic["labels"] == y))
    assert e["lower"] - 0.01 <= accuracy <= e["upper"] + 0.01, (e, accuracy)
    # every segment's realized accuracy from the labels drawn in it, beside its estimate
    segments = windows()["5m"]["segments"]
    realized = [s for s in segments if "realized" in s]
    assert realized and all(0 <= s["realized"]["lower"] <= s["realized"]["upper"] <= 1 for s in realized)
    for dim in {s["dimension"] for s in segments}:
        assert sum(s["realized"]["n"] for s in realized if s["dimension"] == dim) == len(posted)
    db = sqlite3.connect(tmp_path / STORE_FILE)
    kept = [p for (p,) in db.execute("SELECT draw_p FROM labels")]
    db.close()
    assert len(kept) == len(posted) and all(0 < p <= 1 for p in kept)  # the labeled ones, with their π

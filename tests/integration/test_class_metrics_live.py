"""Per-class precision, recall and F1 of a served agent: label-free (CBPE) in every window of
``/v1/estimates`` and ``icos_estimated_class_metric`` (the count window only within the class cap),
equal to the expected confusion matrix of the probabilities the agent answered; realized from delayed
labels in the ``realized`` section and ``icos_realized_class_metric``, equal to scikit-learn's on the
same predictions; only the means above the class cap."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from sklearn.metrics import precision_recall_fscore_support

from agent.data.datasets import Splits
from agent.estimation.statistics.class_metrics import expected_confusion, metrics_of_confusion
from agent.server.app import create_app
from tests.support.inprocess import RunningServer
from tests.support.metrics import scrape
from tests.support.settings import stateful_settings
from tests.support.v2 import post_labels, send_traffic
from tests.support.waiting import wait_until

CLASSES = [str(i) for i in range(10)]


def _windows(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/estimates").json()["windows"])


def test_label_free_and_realized_per_class_figures(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path), CollectorRegistry()))
    x, y = mnist_splits.test.x[:600], mnist_splits.test.y[:600]
    traffic = send_traffic(srv.url, x)
    assert wait_until(lambda: _windows(srv.url)["5m"]["n"] == 600)
    want = metrics_of_confusion(expected_confusion(traffic["probabilities"], traffic["labels"]), CLASSES)
    windows = _windows(srv.url)
    for w in ("5m", "1h", "last100000"):
        got = windows[w]["classes"]["estimated"]
        assert set(got["per_class"]) == set(CLASSES)
        for c in CLASSES:
            for m in ("precision", "recall", "f1", "support"):
                assert got["per_class"][c][m] == pytest.approx(want["per_class"][c][m], rel=1e-4, abs=1e-6), (c, m)
        for mean in ("macro", "weighted"):
            assert got[mean] == pytest.approx(want[mean], rel=1e-4)

    gauge = scrape(srv.url).by_labels("icos_estimated_class_metric")
    mv = (("model", "mnist"), ("version", "1"))
    key = tuple(sorted((*mv, ("window", "1h"), ("class", "_macro"), ("metric", "f1"))))
    assert gauge[key] == pytest.approx(want["macro"]["f1"], rel=1e-4)
    for w in ("5m", "last100000"):
        key = tuple(sorted((*mv, ("window", w), ("class", "7"), ("metric", "recall"))))
        assert gauge[key] == pytest.approx(want["per_class"]["7"]["recall"], rel=1e-4)

    # delayed labels for 400 predictions: realized per-class figures equal scikit-learn's
    idx = np.arange(400)
    post_labels(srv.url, [{"id": str(traffic["ids"][i]), "label": int(y[i])} for i in idx])
    realized = _windows(srv.url)["5m"]["realized"]["classes"]
    p, r, f, s = precision_recall_fscore_support(y[idx], traffic["labels"][idx], labels=range(10), zero_division=0)
    for c in range(10):
        row = realized["per_class"][str(c)]
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx((p[c], r[c], f[c], s[c]))
    p, r, f, _ = precision_recall_fscore_support(
        y[idx], traffic["labels"][idx], labels=range(10), average="macro", zero_division=0
    )
    assert (realized["macro"]["precision"], realized["macro"]["recall"], realized["macro"]["f1"]) == pytest.approx(
        (p, r, f)
    )
    real = scrape(srv.url).by_labels("icos_realized_class_metric")
    key = tuple(sorted((*mv, ("window", "last100000"), ("class", "_macro"), ("metric", "f1"))))
    assert real[key] == pytest.approx(f)


def test_above_the_class_cap_only_the_means(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    settings = stateful_settings(mnist_bundle_dir, tmp_path, metrics={"per_class_label_cap": 5})
    srv = run_server(create_app(settings, CollectorRegistry()))
    traffic = send_traffic(srv.url, mnist_splits.test.x[:200])
    assert wait_until(lambda: _windows(srv.url)["5m"]["n"] == 200)
    post_labels(srv.url, [{"id": str(i), "label": 1} for i in traffic["ids"][:50]])
    w = _windows(srv.url)["5m"]
    assert set(w["classes"]["estimated"]) == {"macro", "weighted"}
    # the count window would keep K probabilities per prediction: only within the cap
    assert "classes" not in _windows(srv.url)["last100000"]
    assert set(w["realized"]["classes"]) == {"macro", "weighted"}
    classes = {dict(k)["class"] for k in scrape(srv.url).by_labels("icos_estimated_class_metric")}
    assert classes == {"_macro", "_weighted"}

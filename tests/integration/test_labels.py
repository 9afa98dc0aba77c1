"""Delayed labels in a running agent: realized accuracy and estimator errors on the labeled subset,
label outcomes, metrics, recalibration (token, minimum, restart, reload), observe-mode ids, an
unwritable prediction store, and the ``icos-agent labels`` command."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.audits.mutation.robustness import probability_errors
from agent.cli import main as cli_main
from agent.data.datasets import Splits
from agent.data.files import Dataset
from agent.dataplane.admission import prediction_ids
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import ESTIMATORS
from agent.model.classifier import OnnxClassifier
from agent.offline.check import check_report
from agent.server.app import create_app
from invariants.bundle import Bundle
from invariants.oracle import VERDICTS
from tests.support.inprocess import RunningServer
from tests.support.metrics import scrape
from tests.support.settings import stateful_settings
from tests.support.v2 import post_labels, send_traffic
from tests.support.waiting import wait_until

TOKEN = "s3cret-token"
WINDOWS = ("5m", "1h", "last100000")


def labeled_truth(
    model: OnnxClassifier, bundle: Path, x: np.ndarray, y: np.ndarray, idx: np.ndarray
) -> tuple[float, dict[str, float], dict[str, int]]:
    """The offline ``check`` of the labeled predictions: accuracy, every estimator (``shift_aware``
    with its full model: margins, TDI leaves, input PCA error) and the verdict counts."""
    report = check_report(model, Bundle.load(bundle), Dataset(x[idx], y[idx]))
    estimates = {k: float(e["value"]) for k, e in report["estimates"].items()}
    return float(report["truth"]["accuracy"]), estimates, dict(report["verdicts"])


def bundle_calibration(bundle: Path) -> EstimatorCalibration:
    return EstimatorCalibration.from_dict(Bundle.load(bundle).estimator_calibration)


def test_realized_accuracy_and_estimator_errors_on_the_labeled_subset(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    mnist_model: OnnxClassifier,
    tmp_path: Path,
) -> None:
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path), CollectorRegistry()))
    x, y = mnist_splits.test.x[:1000], mnist_splits.test.y[:1000]
    traffic = send_traffic(srv.url, x)
    assert len(set(traffic["ids"].tolist())) == 1000 and traffic["ids"][0] == "req-0:0"

    # labels for the first 600 predictions that came back with their verdicts
    idx = np.arange(600)
    entries: list[Any] = [{"id": str(traffic["ids"][i]), "label": int(y[i])} for i in idx]
    extra: list[Any] = [
        {"id": "nope:0", "label": 1},  # unknown
        {"id": "req-0:999", "label": 1},  # unknown (the batch had 100 predictions)
        entries[0],  # duplicate in the same request
        {"id": "req-1:0", "label": 10},  # invalid: no such class
        {"id": "req-1:1", "label": True},  # invalid
        {"label": 3},  # invalid: no id
        "not an object",  # invalid
    ]
    res = post_labels(srv.url, entries + extra)
    assert (res["accepted"], res["unknown"], res["duplicate"], res["invalid"]) == (600, 2, 1, 4)
    assert res["problems"]
    again = post_labels(srv.url, entries[:10] + [{"id": str(traffic["ids"][700]), "label": str(y[700])}])
    assert (again["accepted"], again["duplicate"]) == (1, 10)  # a class name ("7") works too
    idx = np.r_[idx, 700]

    est = httpx.get(f"{srv.url}/v1/estimates").json()
    for w in WINDOWS:
        assert est["windows"][w]["n"] == 1000
        assert est["windows"][w]["realized"]["n"] == 601
    acc_all = float(np.mean(traffic["labels"][idx] == y[idx]))
    realized = est["windows"]["5m"]["realized"]
    assert realized["correct"] == int(np.sum(traffic["labels"][idx] == y[idx]))
    assert realized["accuracy"]["value"] == pytest.approx(acc_all, abs=1e-12)
    assert realized["accuracy"]["lower"] <= acc_all <= realized["accuracy"]["upper"]
    assert set(realized["abs_error"]) == set(ESTIMATORS)
    # every estimator on the labeled subset equals the offline `check` of the same predictions,
    # shift_aware included with its full model (the predictions were stored with its inputs)
    acc, offline, verdict_counts = labeled_truth(mnist_model, mnist_bundle_dir, x, y, idx)
    assert acc == pytest.approx(acc_all)
    served = traffic["verdicts"][idx].tolist()
    assert verdict_counts == {v: served.count(v) for v in VERDICTS}
    assert set(offline) == set(ESTIMATORS)
    # The stored inputs of the full model reach the realized windows: every estimate equals the offline
    # check's, which runs shift_aware's full model (near clean data both the full and the reduced model
    # now give the confidence estimate, so comparing them with each other no longer tells them apart).
    for name, e in realized["estimates"].items():
        assert e["n"] == 601
        assert e["value"] == pytest.approx(offline[name], abs=1e-9), name
        assert realized["abs_error"][name] == pytest.approx(abs(offline[name] - acc_all), abs=1e-9)
    pe = probability_errors(traffic["probabilities"][idx], y[idx])
    for m in ("mae", "mse", "rmse"):
        assert realized["probability_error"][m] == pytest.approx(pe[m], rel=1e-9)

    # Prometheus: realized accuracy, labeled samples, abs errors, probability errors, label outcomes
    mv = (("model", "mnist"), ("version", "1"))
    acc_m = scrape(srv.url).by_labels("icos_realized_accuracy_ratio")
    assert acc_m[(*mv, ("window", "5m"))] == pytest.approx(acc_all)
    n_m = scrape(srv.url).by_labels("icos_labeled_samples")
    assert {k[-1][1]: v for k, v in n_m.items()} == dict.fromkeys(WINDOWS, 601.0)
    err_m = scrape(srv.url).by_labels("icos_estimator_abs_error_ratio")
    for name in ESTIMATORS:
        key = tuple(sorted((*mv, ("estimator", name), ("window", "1h"))))
        assert err_m[key] == pytest.approx(realized["abs_error"][name])
    prob_m = scrape(srv.url).by_labels("icos_probability_error_ratio")
    assert prob_m[tuple(sorted((*mv, ("metric", "rmse"), ("window", "last100000"))))] == pytest.approx(
        pe["rmse"], rel=1e-5
    )
    outcomes = {k[0][1]: v for k, v in scrape(srv.url).by_labels("icos_labels_total").items()}
    assert outcomes == {"accepted": 601.0, "unknown": 2.0, "duplicate": 11.0, "corrected": 0.0, "invalid": 4.0}

    # the last batch was judged off the request path: its predictions take labels too
    late = post_labels(srv.url, [{"id": str(traffic["ids"][i]), "label": int(y[i])} for i in range(950, 1000)])
    assert late["accepted"] == 50
    status = httpx.get(f"{srv.url}/v1/labels").json()
    assert status["store"]["persistent"] is True
    assert (status["store"]["predictions"], status["store"]["labeled"]) == (1000, 651)
    assert status["calibration"]["source"] == "bundle"

    # a malformed body is a client error; an oversized one too
    assert httpx.post(f"{srv.url}/v1/labels", content=b"{").status_code == 400
    assert httpx.post(f"{srv.url}/v1/labels", json={"labels": {"id": "x"}}).status_code == 400
    deep = b'{"labels": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    assert httpx.post(f"{srv.url}/v1/labels", content=deep).status_code == 400
    # an id no stored prediction can have (a lone surrogate, which SQLite cannot hold) is unknown, not a 500
    r = httpx.post(f"{srv.url}/v1/labels", content=b'{"labels": [{"id": "\\ud800:0", "label": 1}]}')
    assert r.status_code == 200 and r.json()["unknown"] == 1, r.text


def test_recalibration_token_minimum_restart_and_reload(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", TOKEN)
    settings = stateful_settings(mnist_bundle_dir, tmp_path, labels={"min_recalibration_samples": 200})
    srv = run_server(create_app(settings, CollectorRegistry()))
    # shifted traffic: noisy images, so that the bundle's calibration is off
    rng = np.random.default_rng(0)
    x = np.clip(mnist_splits.test.x + rng.normal(0, 90, mnist_splits.test.x.shape), 0, 255).astype(np.float32)
    y = mnist_splits.test.y
    traffic = send_traffic(srv.url, x[:800], batch=200)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{srv.url}/v1/recalibrate"
    assert httpx.post(url).status_code == 401
    assert httpx.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 403
    post_labels(srv.url, [{"id": str(traffic["ids"][i]), "label": int(y[i])} for i in range(150)])
    r = httpx.post(url, headers=auth)
    assert r.status_code == 409 and "at least 200" in r.json()["error"]

    idx = np.arange(600)
    post_labels(srv.url, [{"id": str(traffic["ids"][i]), "label": int(y[i])} for i in range(150, 600)])
    r = httpx.post(url, headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    report = r.json()
    verdicts = np.array([VERDICTS.index(v) for v in traffic["verdicts"][idx]])
    correct = traffic["labels"][idx] == y[idx]
    expect = EstimatorCalibration.fit(traffic["probabilities"][idx].max(axis=1), correct, verdicts != 0)
    before = bundle_calibration(mnist_bundle_dir)
    assert report["samples"] == 600 and report["persisted"] is True
    assert report["before"]["tpr"] == pytest.approx(before.tpr)
    for k in ("tpr", "fpr", "n_wrong", "n_right", "accuracy", "avg_conf", "atc_threshold"):
        assert report["after"][k] == pytest.approx(getattr(expect, k), rel=1e-6), k
    assert report["after"] != report["before"]
    # in-sample, the Rogan–Gladen correction recovers the labeled accuracy exactly
    assert report["labeled"]["abs_error_after"]["icos_corrected"] == pytest.approx(0.0, abs=1e-9)
    est = httpx.get(f"{srv.url}/v1/estimates").json()
    assert est["oracle"]["tpr"] == pytest.approx(expect.tpr)
    assert est["windows"]["5m"]["realized"]["abs_error"]["icos_corrected"] == pytest.approx(0.0, abs=1e-9)
    assert est["windows"]["5m"]["segments"]  # the bundle's segments stay
    assert httpx.get(f"{srv.url}/v1/labels").json()["calibration"]["source"] == "labels"
    tpr_m = scrape(srv.url).by_labels("icos_oracle_tpr_ratio")
    assert list(tpr_m.values()) == [pytest.approx(expect.tpr)]
    srv.stop()

    # restart: the refitted calibration and the labeled predictions come back
    srv2 = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path), CollectorRegistry()))
    est = httpx.get(f"{srv2.url}/v1/estimates").json()
    assert est["oracle"]["tpr"] == pytest.approx(expect.tpr)
    assert est["windows"]["1h"]["realized"]["n"] == 600
    assert est["windows"]["1h"]["segments"]
    assert httpx.get(f"{srv2.url}/v1/labels").json()["store"]["predictions"] == 800

    # a reload of the model and bundle discards it, also across the next restart
    assert httpx.post(f"{srv2.url}/v1/reload", headers=auth, timeout=60).status_code == 200
    assert httpx.get(f"{srv2.url}/v1/estimates").json()["oracle"]["tpr"] == pytest.approx(before.tpr)
    assert wait_until(lambda: httpx.get(f"{srv2.url}/v1/labels").json()["calibration"]["source"] == "bundle")
    srv2.stop()
    srv3 = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path), CollectorRegistry()))
    assert httpx.get(f"{srv3.url}/v1/estimates").json()["oracle"]["tpr"] == pytest.approx(before.tpr)


def test_auto_recalibration(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    labels_cfg = {"min_recalibration_samples": 100, "auto_recalibrate_every": 300}
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, None, labels=labels_cfg), CollectorRegistry()))
    x, y = mnist_splits.test.x[:400], mnist_splits.test.y[:400]
    traffic = send_traffic(srv.url, x)
    post_labels(srv.url, [{"id": str(traffic["ids"][i]), "label": int(y[i])} for i in range(200)])
    assert httpx.get(f"{srv.url}/v1/labels").json()["last_recalibration"] is None
    post_labels(srv.url, [{"id": str(traffic["ids"][i]), "label": int(y[i])} for i in range(200, 400)])

    def recalibrated() -> bool:
        last = httpx.get(f"{srv.url}/v1/labels").json()["last_recalibration"]
        return last is not None and last["trigger"] == "auto" and last["samples"] == 400

    assert wait_until(recalibrated, timeout=30)
    status = httpx.get(f"{srv.url}/v1/labels").json()
    assert status["store"]["persistent"] is False  # no state_dir: kept in memory
    assert status["last_recalibration"]["persisted"] is True  # in the in-memory store
    applied = scrape(srv.url).by_labels("icos_recalibrations_total")
    assert applied[(("outcome", "applied"), ("trigger", "auto"))] == 1.0


def test_observe_mode_returns_ids_that_take_labels(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    mnist_model: OnnxClassifier,
    tmp_path: Path,
) -> None:
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path, mode="observe"), CollectorRegistry()))
    x, y = mnist_splits.test.x[:50], mnist_splits.test.y[:50]
    p = mnist_model.predict(x).probabilities
    r = httpx.post(f"{srv.url}/v1/observe", json={"id": "obs-1", "inputs": x.tolist(), "probabilities": p.tolist()})
    assert r.status_code == 202
    assert r.json() == {"id": "obs-1", "accepted": 50}
    ids = prediction_ids("obs-1", 50)
    assert wait_until(lambda: httpx.get(f"{srv.url}/v1/estimates").json()["total_judged"] == 50)
    res = post_labels(srv.url, [{"id": i, "label": int(t)} for i, t in zip(ids, y, strict=True)])
    assert res["accepted"] == 50
    realized = httpx.get(f"{srv.url}/v1/estimates").json()["windows"]["last100000"]["realized"]
    assert realized["accuracy"]["value"] == pytest.approx(float(np.mean(p.argmax(axis=1) == y)))


def test_unwritable_prediction_store_keeps_serving(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    (tmp_path / "predictions.sqlite3").mkdir()  # the store's file cannot be created
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path), CollectorRegistry()))
    x, y = mnist_splits.test.x[:100], mnist_splits.test.y[:100]
    traffic = send_traffic(srv.url, x, batch=50)
    assert len(traffic["ids"]) == 100
    errors = scrape(srv.url).by_labels("icos_prediction_store_errors_total")
    assert errors[(("operation", "open"),)] == 1.0
    status = httpx.get(f"{srv.url}/v1/labels").json()
    assert status["store"]["persistent"] is False
    res = post_labels(srv.url, [{"id": str(i), "label": int(t)} for i, t in zip(traffic["ids"], y, strict=True)])
    assert res["accepted"] == 100  # labels still work, in memory


def test_labels_command_posts_csv_and_jsonl(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, None), CollectorRegistry()))
    x, y = mnist_splits.test.x[:300], mnist_splits.test.y[:300]
    traffic = send_traffic(srv.url, x)
    csv_path = tmp_path / "labels.csv"
    rows = ["prediction,truth"] + [f"{i},{t}" for i, t in zip(traffic["ids"][:200], y[:200], strict=True)]
    csv_path.write_text("\n".join([*rows, "ghost:1,3", ""]))
    args = ["labels", "--url", srv.url, "--file", str(csv_path), "--id-column", "prediction"]
    code = cli_main([*args, "--label-column", "truth", "--chunk-size", "64", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["sent"], summary["accepted"], summary["unknown"]) == (201, 200, 1)

    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps({"id": str(i), "label": int(t)}) for i, t in zip(traffic["ids"][150:], y[150:], strict=True)
        )
    )
    assert cli_main(["labels", "--url", srv.url, "--file", str(jsonl), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "150 labels sent: 100 accepted, 0 unknown, 50 duplicate, 0 corrected, 0 invalid" in out

    assert cli_main(["labels", "--url", srv.url, "--file", str(csv_path)]) == 2  # no "id" column
    assert "no column 'id'" in capsys.readouterr().err

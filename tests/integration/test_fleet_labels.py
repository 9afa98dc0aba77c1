"""The fleet's ``with_labels`` against real parts: three ``icos-agent serve`` replicas of a scikit-learn
digits model (skl2onnx) serving *different* traffic (clean, shifted, half of each), one real PostgreSQL
prediction store shared by them, a real Prometheus scraping them every second (with the shipped rules),
and ``mode: fleet`` reading both.

A replica's own ``with_labels`` adds the fleet's labels to its own window, which is wrong when the
replicas' traffic differs; the fleet's adds them to the sum of every replica's window. It must equal the
prediction-powered accuracy of all the traffic with the same labels, computed here by the library from
the answers the replicas gave (|Δ| ≤ 0.005), its interval must cover the true accuracy of all the
traffic, the realized figures (per class and per segment too) must be those of every labeled prediction, the recorded
headline must take ``with_labels`` exactly when its interval is the narrower, and a store that goes
down must cost ``with_labels`` only (counted), the label-free estimates staying."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sklearn.metrics import precision_recall_fscore_support

from agent.estimation.estimators.prediction_powered import WITH_LABELS, prediction_powered_accuracy
from agent.estimation.statistics.class_metrics import window_class_metrics
from agent.estimation.statistics.window import WindowStats
from tests.support.agent_process import AgentProcess
from tests.support.digits import digits
from tests.support.metrics import Scrape, scrape
from tests.support.postgres import PostgresDatabase
from tests.support.prometheus import FAST, PrometheusServer
from tests.support.v2 import decoded_answer
from tests.support.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
MODEL = "digits"
WINDOWS = ["5m", "15m"]
#: A 95 % interval misses one window in twenty; with most of the window's predictions in the sample, the
#: interval (which leaves out the finite-population correction, ``1 − sampled share``) is conservative
#: for the accuracy of exactly these predictions, so a miss is rare enough for a test that cannot seed
#: the agents' draws.
SAMPLE_RATE = 0.6
pytestmark = [pytest.mark.needs("prometheus"), pytest.mark.needs("postgresql"), pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def digits_model(digits_logreg: dict[str, Path]) -> dict[str, Any]:
    """A logistic regression on sklearn digits, exported by skl2onnx, with its bundle; and held-out rows."""
    x, y = digits()
    return {**digits_logreg, "x": x[1400:], "y": y[1400:]}


@pytest.fixture
def parts(digits_model: dict[str, Any], postgres: PostgresDatabase, tmp_path: Path) -> Iterator[dict[str, Any]]:
    env = {"ICOS_AGENT_LABELS__STORE_URL": postgres.url}  # the password from the environment, as deployed

    def config(name: str, mode: str = "serve") -> dict[str, Any]:
        return {
            "mode": mode,
            "model": {"name": MODEL, "version": "1", "path": str(digits_model["model"])},
            "bundle": {"path": str(digits_model["bundle"])},
            "windows": {"time": WINDOWS},
            "state_dir": str(tmp_path / f"state-{name}"),
            "labels": {"sample_rate": SAMPLE_RATE, "fleet_refresh_seconds": 1, "flush_interval_seconds": 0.2},
        }

    started: list[AgentProcess] = []
    prom: PrometheusServer | None = None
    try:
        replicas = [AgentProcess(tmp_path, config(f"r{i}"), env=env).start() for i in range(3)]
        started += replicas
        prom = PrometheusServer(tmp_path, {})
        fleet_cfg = config("fleet", "fleet")
        fleet_cfg["model"] = {"name": MODEL, "version": "1"}  # the model's identity comes from the bundle
        fleet_cfg["fleet"] = {
            "prometheus_url": prom.url,
            "refresh_seconds": 1,
            "query_timeout_seconds": 2,
            "lookback_seconds": 60,
            "stale_after_seconds": 30,  # a refresh waits up to the store's timeouts while it is down
            "selector": 'job="icos-agent"',
        }
        fleet = AgentProcess(tmp_path, fleet_cfg, env=env)
        prom.config = {
            "global": dict(FAST),
            "rule_files": [str(ROOT / "deploy" / "prometheus" / "icos-agent.rules.yml")],
            "scrape_configs": [
                {"job_name": "icos-agent", "static_configs": [{"targets": [f"127.0.0.1:{r.port}" for r in replicas]}]},
                {"job_name": "icos-agent-fleet", "static_configs": [{"targets": [f"127.0.0.1:{fleet.port}"]}]},
            ],
        }
        prom.start()
        started.append(fleet.start())
        yield {"replicas": replicas, "fleet": fleet, "prometheus": prom, "postgres": postgres}
    finally:
        for p in started:
            p.kill()
        if prom is not None:
            prom.stop()


def _infer(client: httpx.Client, url: str, x: np.ndarray, rid: str) -> dict[str, Any]:
    body = {
        "id": rid,
        "inputs": [{"name": "X", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": "probabilities"}, {"name": "label"}],
    }
    r = client.post(f"{url}/v2/models/{MODEL}/infer", json=body)
    assert r.status_code == 200, r.text
    return decoded_answer(r.json())


def _estimates(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/estimates", timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _mixes(x: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Clean digits, shifted ones (fainter and noisy, pixel values 0–16) and half of each."""
    shifted = np.clip(x * 0.45 + rng.normal(0, 3.0, x.shape), 0, 16).astype(np.float32)
    half = len(x) // 2
    return [x, shifted, np.concatenate([x[:half], shifted[half:]])]


def test_fleet_with_labels_is_one_agent_on_all_the_traffic(parts: dict[str, Any], digits_model: dict[str, Any]) -> None:
    replicas: list[AgentProcess] = parts["replicas"]
    fleet: AgentProcess = parts["fleet"]
    prom: PrometheusServer = parts["prometheus"]
    poll(lambda: len(prom.query('up{job=~"icos-agent.*"} == 1')) == 4, what="replicas and fleet scraped")
    x, y = digits_model["x"], digits_model["y"]
    ids: list[str] = []
    conf: list[np.ndarray] = []
    predicted: list[np.ndarray] = []
    probabilities: list[np.ndarray] = []
    right: list[np.ndarray] = []
    truth: dict[str, int] = {}
    with httpx.Client(timeout=30) as client:
        for i, (replica, xs) in enumerate(zip(replicas, _mixes(x, np.random.default_rng(0)), strict=True)):
            for k, start in enumerate(range(0, len(xs), 50)):
                res = _infer(client, replica.url, xs[start : start + 50], f"r{i}-{k}")
                ys = y[start : start + 50]
                ids += res["ids"]
                conf.append(res["probabilities"].max(axis=1).astype(np.float64))
                predicted.append(res["label"].reshape(-1).astype(np.int64))
                probabilities.append(res["probabilities"])
                right.append(predicted[-1] == ys)
                truth.update(zip(res["ids"], ys.tolist(), strict=True))
    f, correct = np.concatenate(conf), np.concatenate(right)
    total, accuracy = len(ids), float(correct.mean())
    per_replica = [float(r.mean()) for r in np.array_split(correct, 3)]
    print(f"accuracy of all traffic {accuracy:.4f}; per replica {per_replica}")
    assert max(per_replica) - min(per_replica) > 0.1  # the mixes differ

    def drawn_by_all() -> int:
        return int(sum(scrape(rep.url).value("icos_label_sample_total") for rep in replicas))

    def listed() -> list[str]:
        """The sample as the shared store lists it, once it holds every replica's draws."""
        body = httpx.get(f"{replicas[0].url}/v1/labels/requests", params={"limit": 1000}, timeout=10).json()
        got = [str(r["id"]) for r in body["requests"]]
        return got if got and len(got) == drawn_by_all() else []

    def all_judged() -> bool:
        return all(_estimates(rep.url)["total_judged"] >= len(x) for rep in replicas)

    poll(all_judged, what="every replica judged its traffic")
    sample = poll(listed, what="every replica's labeling sample in the shared store")
    assert len(set(sample)) == len(sample) and {t.split("-")[0] for t in sample} == {"r0", "r1", "r2"}
    # labels for every prediction: the sample's enter with_labels, all of them the realized accuracy
    position = {pid: i for i, pid in enumerate(ids)}
    r = httpx.post(
        f"{replicas[1].url}/v1/labels", json={"labels": [{"id": t, "label": truth[t]} for t in ids]}, timeout=60
    )
    assert r.status_code == 200 and r.json()["accepted"] == total, r.text
    drawn = np.array([position[pid] for pid in sample])
    want = prediction_powered_accuracy(total, float(f.sum()), float((f * f).sum()), f[drawn], correct[drawn])
    assert want is not None

    def fleet_has_labels() -> dict[str, Any]:
        body = _estimates(fleet.url)
        w = body["windows"].get("5m")
        ok = w and w["n"] == total and w["estimates"].get(WITH_LABELS, {}).get("n_labels") == len(sample)
        return body if ok and w["realized"]["n"] == total else {}

    body = poll(fleet_has_labels, timeout=90, what="the fleet's with_labels on every label")
    for window in WINDOWS:
        w = body["windows"][window]
        got = w["estimates"][WITH_LABELS]
        print(
            f"{window}: fleet with_labels {got['value']:.5f} [{got['lower']:.4f}, {got['upper']:.4f}], one agent "
            f"{want.value:.5f}, truth {accuracy:.5f}, labels {got['n_labels']} of {total}"
        )
        assert abs(got["value"] - want.value) <= 0.005
        assert abs(got["lower"] - want.lower) <= 0.005 and abs(got["upper"] - want.upper) <= 0.005
        assert got["lower"] <= accuracy <= got["upper"]
        assert w["n_labels"] == len(sample) and got["n"] == total
        realized = w["realized"]
        assert realized["n"] == total and realized["correct"] == int(correct.sum())
        assert realized["n_sampled"] == len(sample)
        # every segment's realized accuracy from every replica's labels of the sample (segments kept in the store)
        segments = w["segments"]
        assert segments
        for dim in {seg["dimension"] for seg in segments}:
            mine = [seg["realized"] for seg in segments if seg["dimension"] == dim and "realized" in seg]
            assert sum(r["n"] for r in mine) == len(sample)
            assert sum(r["value"] * r["n"] for r in mine) == pytest.approx(float(correct[drawn].sum()))
        precision, recall, f1, support = precision_recall_fscore_support(
            [truth[t] for t in ids], np.concatenate(predicted), labels=list(range(10)), zero_division=0
        )
        per_class = realized["classes"]["per_class"]
        assert sorted(per_class, key=int) == [str(k) for k in range(10)]
        for k in range(10):
            c = per_class[str(k)]
            assert c["support"] == support[k]
            assert c["precision"] == pytest.approx(precision[k]) and c["recall"] == pytest.approx(recall[k])
            assert c["f1"] == pytest.approx(f1[k])

    # the label-free per-class figures (CBPE) of the fleet: one agent's on all the traffic
    union = WindowStats()
    union.add_class_sums(np.concatenate(probabilities), np.concatenate(predicted))
    names = [str(k) for k in range(10)]
    one_agent = window_class_metrics(union.cbpe_predicted, union.cbpe_true_positive, union.cbpe_support, names)
    assert one_agent is not None
    for window in WINDOWS:
        estimated = body["windows"][window]["classes"]["estimated"]
        for name in names:
            for metric in ("precision", "recall", "f1"):
                assert abs(estimated["per_class"][name][metric] - one_agent["per_class"][name][metric]) <= 1e-4
        assert estimated["macro"]["f1"] == pytest.approx(one_agent["macro"]["f1"], abs=1e-4)

    # the replicas' own with_labels mix the fleet's labels with their own traffic: not the fleet's figure
    own = [_estimates(rep.url)["windows"]["5m"]["estimates"].get(WITH_LABELS) for rep in replicas]
    print("replicas' own with_labels:", [round(e["value"], 4) if e else None for e in own])

    m = scrape(fleet.url)
    _check_metrics(m, body["windows"]["5m"]["estimates"][WITH_LABELS])
    f1_of_3 = m.value("icos_fleet_estimated_class_metric", model=MODEL, window="5m", **{"class": "3", "metric": "f1"})
    assert f1_of_3 == pytest.approx(body["windows"]["5m"]["classes"]["estimated"]["per_class"]["3"]["f1"])

    # the recorded headline takes with_labels where its interval is the narrower, and names it
    w5 = body["windows"]["5m"]
    label_free = w5["headline"] if w5["headline"]["estimator"] != WITH_LABELS else None
    assert label_free is not None  # the fleet's own headline stays the bundle's (label-free)
    got = w5["estimates"][WITH_LABELS]
    chosen = (
        WITH_LABELS
        if got["upper"] - got["lower"] < label_free["upper"] - label_free["lower"]
        else label_free["estimator"]
    )

    def recorded() -> list[dict[str, Any]]:
        res = prom.query(f'icos:headline_accuracy:ratio5m{{model="{MODEL}"}}')
        # until the evaluator's series is fresh in the rules, the agents' own headline is recorded
        fresh = len(res) == 1 and res[0]["metric"].get("source") == "fleet"
        return res if fresh and res[0]["metric"].get("estimator") == chosen else []

    rec = poll(recorded, what=f"the recorded headline from {chosen}")
    print(f"recorded headline: {rec[0]['metric']} = {rec[0]['value'][1]}")
    assert rec[0]["metric"]["source"] == "fleet"

    # the store down: with_labels goes, counted; the label-free estimates stay fresh
    postgres: PostgresDatabase = parts["postgres"]
    postgres.stop()

    def label_free_only() -> dict[str, Any]:
        b = _estimates(fleet.url)
        w = b["windows"].get("5m", {})
        ok = b["fleet"]["labels"]["last_error"] and WITH_LABELS not in w.get("estimates", {WITH_LABELS: 1})
        return b if ok and not b["fleet"]["stale"] and w["n"] == total else {}

    down = poll(
        label_free_only,
        timeout=90,
        what="label-free estimates while the store is down",
        explain=lambda: (_estimates(fleet.url)["fleet"], fleet.log_path.read_text()[-3000:]),
    )
    assert down["fleet"]["labels"]["last_error"].startswith("unreachable")
    # the store's password is in neither the answer nor the log
    assert postgres.PASSWORD not in str(down) and postgres.PASSWORD not in fleet.log_path.read_text()
    assert down["windows"]["5m"]["headline"]["estimator"] == label_free["estimator"]
    assert scrape(fleet.url).value("icos_fleet_label_errors_total", model=MODEL, reason="unreachable") >= 1
    postgres.start()
    poll(fleet_has_labels, timeout=90, what="with_labels back once the store is")


def _check_metrics(m: Scrape, est: dict[str, Any]) -> None:
    labels = {"model": MODEL, "version": "1", "estimator": WITH_LABELS, "window": "5m"}
    for suffix, key in (("", "value"), ("_lower", "lower"), ("_upper", "upper")):
        assert m.value(f"icos_fleet_estimated_accuracy_ratio{suffix}", **labels) == pytest.approx(est[key])


def test_fleet_labels_read_one_capped_time_range_of_one_identity(postgres: PostgresDatabase) -> None:
    """What the fleet reads of the store: the labeled predictions of its identity made within its longest
    window before ``at`` (none later, none of another identity), each window's labeling-sample sums from
    the sampled ones only; and when the row cap cuts the read short, the windows reaching back past the
    oldest row read get no labels (the rows kept are the newest, not a random share of the window)."""
    from agent.estimation.calibration import EstimatorCalibration
    from agent.estimation.statistics.window import WindowStats
    from agent.fleet.labels import FleetLabels
    from agent.labels.postgres_backend import PostgresBackend
    from agent.labels.rows import PendingBatch
    from agent.labels.store import PredictionStore

    cal = EstimatorCalibration(
        tpr=0.6, fpr=0.05, n_wrong=100, n_right=900, accuracy=0.9, avg_conf=0.92, atc_threshold=0.7
    )
    at = 100_000.0
    rng = np.random.default_rng(1)
    store = PredictionStore(None, max_predictions=10_000, max_age_seconds=1e12, store_url=postgres.url)
    store.open()
    # (request id, age before `at`, identity): 1000 s (outside both windows), 600 s (15m only), 100 s
    # (both), another identity's, and one made after `at`
    made = [
        ("old", 1000.0, "m:b"),
        ("mid", 600.0, "m:b"),
        ("new", 100.0, "m:b"),
        ("else", 100.0, "x:y"),
        ("late", -5.0, "m:b"),
    ]
    truth: dict[str, int] = {}
    probs: dict[str, np.ndarray] = {}
    for rid, age, identity in made:
        p = rng.dirichlet(np.ones(3), 6).astype(np.float32)
        store.enqueue(
            PendingBatch(rid, at - age, identity, p, p.argmax(axis=1), np.zeros(6, np.int8), sampled=np.arange(0, 6, 2))
        )
        probs[rid] = p
        truth.update({f"{rid}:{i}": int(rng.integers(3)) for i in range(6)})
    store.flush(now=at)
    assert store.apply_labels(sorted(truth.items()), now=at).n_accepted == len(truth)
    store.stop()

    def lab(rids: list[str]) -> WindowStats:
        f = np.concatenate([probs[r].max(axis=1)[::2] for r in rids]).astype(np.float64)
        y = np.array([probs[r].argmax(axis=1)[i] == truth[f"{r}:{i}"] for r in rids for i in range(0, 6, 2)])
        return WindowStats.of_labeled_sample(f, y)

    backend = PostgresBackend(postgres.url, max_predictions=10_000, max_age_seconds=1e12, pool_size=1)
    backend.open()
    try:
        windows = {"5m": 300.0, "15m": 900.0}
        read = FleetLabels(backend, "m:b", windows, cap=1000, classes=["a", "b", "c"], per_class_cap=20).read(at, cal)
        assert read.rows == 12 and read.truncated == ()
        for name, rids in (("5m", ["new"]), ("15m", ["mid", "new"])):
            want, got = lab(rids), read.sums[name]
            assert got.lab_n == want.lab_n == 3 * len(rids)
            assert got.lab_y_sum == want.lab_y_sum and got.lab_f_sum == pytest.approx(want.lab_f_sum)
            realized = read.realized[name]
            assert realized is not None and realized.n == 6 * len(rids) and realized.classes is not None
        # a cap of 8 rows keeps the newest 8 (6 of "new", 2 of "mid"): 15m reaches back past them
        capped = FleetLabels(backend, "m:b", windows, cap=8).read(at, cal)
        assert capped.rows == 8 and capped.truncated == ("15m",)
        assert set(capped.sums) == {"5m"} and capped.sums["5m"].lab_n == 3
    finally:
        backend.close()

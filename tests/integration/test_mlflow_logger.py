"""MlflowLogger against a real `mlflow server` (sqlite backend, proxied artifacts) and a local sqlite store.

One server per module; the outage test stops it and starts it again on the same port and backend.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporters.mlflow_logger import (
    TAG_KIND,
    TAG_MODEL_NAME,
    TAG_MODEL_SHA256,
    TAG_MODEL_VERSION,
    TAG_RECORD_ID,
    TAG_SERIES,
    MlflowLogger,
    RunRecord,
    SpoolError,
    download_model,
    load_model_from_uri,
    log_model,
)
from tests.support.mlflow import MlflowServer
from tests.support.mounts import read_only_dir
from tests.support.ports import free_port

MODEL_FILE = Path(__file__).resolve().parents[2] / "agent" / "shipped_models" / "digits_cnn.onnx"
SHA = "ab" * 32
START_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), start_timeout=START_TIMEOUT_S)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _runs_with_record(uri: str, experiment: str, record_id: str) -> list[Any]:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    return list(client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_RECORD_ID}` = '{record_id}'"))


def _audit(name: str = "dscore audit", **kw: Any) -> RunRecord:
    now = time.time()
    base: dict[str, Any] = dict(
        kind="dscore",
        name=name,
        params={"n": 4, "t": 0.25, "augment": True, "target": "conv"},
        metrics={"dscore": 0.83, "robustness": 0.91, "fitness": 0.74},
        tags={"team": "ml"},
        artifacts={"report.json": b'{"dscore": 0.83}', "heatmaps/region.png": b"\x89PNG\r\n\x1a\nfake"},
        started_at=now - 12.5,
        finished_at=now,
        model_name="digits",
        model_version="3",
        model_sha256=SHA,
    )
    base.update(kw)
    return RunRecord(**base)


def test_run_arrives_with_params_metrics_artifacts_and_tags(server: MlflowServer, tmp_path: Path) -> None:
    logger = MlflowLogger(server.uri, "audits", tmp_path / "spool")
    record = _audit()
    run_id = logger.log(record)
    assert run_id is not None
    assert logger.pending() == 0

    run = _client(server.uri).get_run(run_id)
    assert run.info.run_name == "dscore audit"
    assert run.info.status == "FINISHED"
    assert run.info.start_time == round(record.started_at * 1000)
    assert run.info.end_time == round(record.finished_at * 1000)
    assert run.data.params == {"n": "4", "t": "0.25", "augment": "True", "target": "conv"}
    assert run.data.metrics == {"dscore": 0.83, "robustness": 0.91, "fitness": 0.74}
    tags = run.data.tags
    assert tags[TAG_KIND] == "dscore"
    assert tags[TAG_RECORD_ID] == record.record_id
    assert (tags[TAG_MODEL_NAME], tags[TAG_MODEL_VERSION], tags[TAG_MODEL_SHA256]) == ("digits", "3", SHA)
    assert tags["team"] == "ml"

    out = tmp_path / "download"
    from mlflow.artifacts import download_artifacts

    local = Path(download_artifacts(run_id=run_id, artifact_path="", dst_path=str(out), tracking_uri=server.uri))
    assert (local / "report.json").read_bytes() == b'{"dscore": 0.83}'
    assert (local / "heatmaps" / "region.png").read_bytes() == b"\x89PNG\r\n\x1a\nfake"

    # the same record again is not a second run
    assert logger.log(record) == run_id
    assert len(_runs_with_record(server.uri, "audits", record.record_id)) == 1


def test_estimate_snapshots_append_to_one_run_per_model_version_and_day(server: MlflowServer, tmp_path: Path) -> None:
    logger = MlflowLogger(server.uri, "estimates", tmp_path / "spool")
    t0 = 1_790_000_000.0  # a fixed instant; all snapshots on the same UTC day
    run_ids = set()
    for i in range(3):
        snap = RunRecord(
            kind="estimates",
            name="estimates",
            params={"window": "1h"},
            metrics={"icos": 0.90 + i / 100, "avg_conf": 0.95},
            started_at=t0 + 60 * i,
            finished_at=t0 + 60 * i,
            model_name="digits",
            model_version="3",
            model_sha256=SHA,
        )
        run_ids.add(logger.log(snap))
        if i == 2:
            assert logger.log(snap) in run_ids  # re-delivery of the same snapshot is harmless
    other_version = RunRecord(
        kind="estimates",
        name="estimates",
        metrics={"icos": 0.5},
        finished_at=t0,
        model_name="digits",
        model_version="4",
    )
    other_run = logger.log(other_version)
    assert len(run_ids) == 1 and None not in run_ids and other_run not in run_ids

    client = _client(server.uri)
    (run_id,) = run_ids
    history = client.get_metric_history(run_id, "icos")
    assert [(m.step, m.value) for m in history] == [(int(t0), 0.90), (int(t0) + 60, 0.91), (int(t0) + 120, 0.92)]
    run = client.get_run(run_id)
    assert run.data.tags[TAG_SERIES].startswith("estimates/")
    assert run.data.tags[TAG_MODEL_VERSION] == "3"
    assert run.data.params == {"window": "1h"}


def test_outage_spools_and_flush_delivers_exactly_once(server: MlflowServer, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    logger = MlflowLogger(server.uri, "outage", spool, retry_after_s=3600)
    assert logger.log(_audit("before")) is not None

    server.stop()
    first, second = _audit("during 1"), _audit("during 2", kind="mutation")
    assert logger.log(first) is None
    assert logger.pending() == 1
    spool_file = spool / f"{first.record_id}.json"
    assert spool_file.is_file()
    saved = spool_file.read_bytes()
    assert logger.log(second) is None  # spooled at once while MLflow is known to be down
    assert logger.pending() == 2
    assert logger.stats().available is False

    server.start()
    assert logger.flush() == 2
    assert logger.pending() == 0
    assert logger.flush() == 0
    assert logger.stats().available is True

    # the spool file's deletion "failed": it reappears, and flushing again must not log a second run
    spool_file.write_bytes(saved)
    assert logger.pending() == 1
    assert logger.flush() == 1
    assert logger.pending() == 0
    for record in (first, second):
        runs = _runs_with_record(server.uri, "outage", record.record_id)
        assert len(runs) == 1
        assert runs[0].data.metrics["dscore"] == 0.83
        assert runs[0].info.status == "FINISHED"

    # a crash after the run was created but before it was finished: the partial run is replaced
    third = _audit("interrupted")
    client = _client(server.uri)
    exp = client.get_experiment_by_name("outage")
    partial = client.create_run(exp.experiment_id, tags={TAG_RECORD_ID: third.record_id}, run_name="interrupted")
    run_id = logger.log(third)
    runs = _runs_with_record(server.uri, "outage", third.record_id)
    assert [r.info.run_id for r in runs] == [run_id]
    assert run_id != partial.info.run_id
    assert client.get_run(partial.info.run_id).info.lifecycle_stage == "deleted"

    # with records pending, a new record queues behind them and is delivered by the same call
    logger_b = MlflowLogger(server.uri, "outage", spool)
    late = _audit("late")
    spool_file.write_bytes(saved)
    assert logger_b.log(late) is not None
    assert logger_b.pending() == 0
    assert len(_runs_with_record(server.uri, "outage", first.record_id)) == 1


def test_unreachable_server_with_read_only_spool_raises_spool_error(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    logger = MlflowLogger(f"http://127.0.0.1:{free_port()}", "audits", spool)
    with read_only_dir(spool):
        with pytest.raises(SpoolError, match="cannot write spool file"):
            logger.log(_audit())
        assert logger.pending() == 0
    # once writable again the next record is spooled
    assert logger.log(_audit()) is None
    assert logger.pending() == 1


def test_default_sqlite_store_without_server(tmp_path: Path) -> None:
    state = tmp_path / "state"
    logger = MlflowLogger(None, "icos-agent", state / "spool")
    assert logger.tracking_uri == f"sqlite:///{(state / 'mlflow.db').resolve()}"
    record = _audit()
    run_id = logger.log(record)
    assert run_id is not None
    assert (state / "mlflow.db").is_file()
    artifacts = list((state / "mlartifacts").rglob("region.png"))
    assert len(artifacts) == 1 and artifacts[0].read_bytes() == b"\x89PNG\r\n\x1a\nfake"
    # a second logger (another process start) on the same store does not log the record twice
    again = MlflowLogger(None, "icos-agent", state / "spool")
    assert again.log(record) == run_id
    assert len(_runs_with_record(logger.tracking_uri, "icos-agent", record.record_id)) == 1

    # a deleted experiment keeps records spooled (not rejected) until it is restored
    client = _client(logger.tracking_uri)
    experiment_id = client.get_experiment_by_name("icos-agent").experiment_id
    client.delete_experiment(experiment_id)
    later = _audit("after delete")
    assert logger.log(later) is None
    assert logger.pending() == 1 and logger.rejected() == 0
    assert "deleted" in (logger.stats().last_error or "")
    assert logger.flush() == 0
    client.restore_experiment(experiment_id)
    assert logger.flush() == 1
    assert len(_runs_with_record(logger.tracking_uri, "icos-agent", later.record_id)) == 1


def test_model_uri_round_trip(server: MlflowServer, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "nested").mkdir(parents=True)
    (bundle / "manifest.json").write_text('{"format": 1}')
    (bundle / "adi.onnx").write_bytes(b"forest")
    (bundle / "nested" / "tdi.json").write_text("{}")
    registered = log_model(
        MODEL_FILE, registered_name="digits-cnn", tracking_uri=server.uri, experiment="models", bundle_dir=bundle
    )
    assert registered.version == "1"
    assert registered.model_uri == "models:/digits-cnn/1"

    got = download_model("models:/digits-cnn/1", server.uri, tmp_path / "dl1")
    assert got.onnx_path.name == MODEL_FILE.name
    assert hashlib.sha256(got.onnx_path.read_bytes()).digest() == hashlib.sha256(MODEL_FILE.read_bytes()).digest()
    assert got.bundle_dir is not None
    assert sorted(str(p.relative_to(got.bundle_dir)) for p in got.bundle_dir.rglob("*") if p.is_file()) == [
        "adi.onnx",
        "manifest.json",
        "nested/tdi.json",
    ]

    _client(server.uri).set_registered_model_alias("digits-cnn", "production", "1")
    by_alias = load_model_from_uri("models:/digits-cnn@production", server.uri, tmp_path / "dl2")
    assert by_alias.read_bytes() == MODEL_FILE.read_bytes()
    by_run = download_model(f"runs:/{registered.run_id}/model", server.uri, tmp_path / "dl3")
    assert by_run.onnx_path.read_bytes() == MODEL_FILE.read_bytes() and by_run.bundle_dir is not None
    single_file = load_model_from_uri(f"runs:/{registered.run_id}/model/{MODEL_FILE.name}", server.uri, tmp_path / "d4")
    assert single_file.read_bytes() == MODEL_FILE.read_bytes()

    second = log_model(MODEL_FILE, registered_name="digits-cnn", tracking_uri=server.uri, experiment="models")
    assert second.version == "2"
    latest = download_model("models:/digits-cnn/latest", server.uri, tmp_path / "dl5")
    assert latest.bundle_dir is None

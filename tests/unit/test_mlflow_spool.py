"""The MLflow spool: record validation, file format, order, atomicity, and failures as SpoolError."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from exporters.run_record import RunRecord
from exporters.spool import CORRUPT_DIR, REJECTED_DIR, Spool, SpoolError, decode, encode
from tests.support.mounts import read_only_dir, tmpfs

ROOT = Path(__file__).resolve().parents[2]


def _record(**kw: Any) -> RunRecord:
    base: dict[str, Any] = dict(
        kind="mutation",
        name="mutation audit",
        params={"operator": "DEC", "repetitions": 5, "ratio": 0.1, "seeded": True},
        metrics={"mae_change": 0.12, "nan": math.nan, "up": math.inf, "down": -math.inf, "count": 3},
        tags={"team": "ml"},
        artifacts={"report.json": b'{"a": 1}', "plots/heat map.png": bytes(range(256))},
        started_at=1_790_000_000.25,
        finished_at=1_790_000_010.5,
        model_name="digits",
        model_version="3",
        model_sha256="0f" * 32,
    )
    base.update(kw)
    return RunRecord(**base)


def _strict_json(data: bytes) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(data, parse_constant=refuse)


# -- records -------------------------------------------------------------------------------------
def test_record_round_trips_through_strict_json() -> None:
    rec = _record()
    data = json.dumps(rec.to_json(), allow_nan=False)
    back = RunRecord.from_json(_strict_json(data.encode()))
    assert back.params == rec.params and type(back.params["seeded"]) is bool and type(back.params["repetitions"]) is int
    assert back.artifacts == rec.artifacts
    assert math.isnan(back.metrics["nan"]) and back.metrics["up"] == math.inf and back.metrics["down"] == -math.inf
    assert back.metrics["mae_change"] == 0.12
    assert (back.started_at, back.finished_at, back.record_id) == (rec.started_at, rec.finished_at, rec.record_id)
    assert (back.model_name, back.model_version, back.model_sha256, back.step) == ("digits", "3", "0f" * 32, None)


def test_record_tags_params_and_steps() -> None:
    rec = _record()
    tags = rec.run_tags()
    assert tags["icos.kind"] == "mutation" and tags["icos.record_id"] == rec.record_id
    assert (tags["icos.model.name"], tags["icos.model.version"], tags["icos.model.sha256"]) == (
        "digits",
        "3",
        "0f" * 32,
    )
    assert "icos.model.name" not in _record(model_name="").run_tags()
    assert rec.params_as_text() == {"operator": "DEC", "repetitions": "5", "ratio": "0.1", "seeded": "True"}
    assert rec.metric_step == 0
    snap = _record(kind="estimates", finished_at=1_790_000_123.9)
    assert snap.is_snapshot and snap.metric_step == 1_790_000_123
    assert _record(kind="estimates", step=7).metric_step == 7
    assert _record().record_id != _record().record_id


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "Fit"}, "kind"),
        ({"name": ""}, "run name"),
        ({"record_id": "../etc"}, "record_id"),
        ({"params": {"bad\nkey": 1}}, "param name"),
        ({"params": {"a": [1, 2]}}, "type list"),
        ({"params": {"a": "x" * 6001}}, "longer than"),
        ({"metrics": {"a": "0.5"}}, "must be a number"),
        ({"metrics": {"a": True}}, "must be a number"),
        ({"metrics": {"../a": 1.0}}, "'..'"),
        ({"tags": {"a": 1}}, "tag 'a'"),
        ({"tags": {"mlflow.runName": "x"}}, "run name"),
        ({"artifacts": {"../x.json": b""}}, "relative POSIX path"),
        ({"artifacts": {"/abs.json": b""}}, "relative POSIX path"),
        ({"artifacts": {"a\\b": b""}}, "relative POSIX path"),
        ({"artifacts": {"x.json": "text"}}, "must be bytes"),
        ({"artifacts": {"a": b"", "a/b": b""}}, "both files and directories"),
        ({"finished_at": math.nan}, "finished_at"),
        ({"step": -1}, "step"),
        ({"model_sha256": "abc"}, "model_sha256"),
    ],
)
def test_record_validation(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _record(**change)


def test_from_json_rejects_malformed() -> None:
    good = _record().to_json()
    for broken in (
        {**good, "format": "other"},
        {**good, "version": 2},
        {k: v for k, v in good.items() if k != "metrics"},
        {**good, "metrics": {"a": "1.5"}},
        {**good, "artifacts": {"a": "not base64!"}},
    ):
        with pytest.raises(ValueError):
            RunRecord.from_json(broken)


# -- spool files ---------------------------------------------------------------------------------
def test_spool_file_format(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    rec = _record()
    path = spool.put(rec)
    assert path == tmp_path / "spool" / f"{rec.record_id}.json"
    payload = _strict_json(path.read_bytes())
    assert payload["format"] == "icos-agent/mlflow-spool" and payload["version"] == 1
    assert isinstance(payload["spooled_at_ns"], int)
    assert payload["record"]["artifacts"]["report.json"] == "eyJhIjogMX0="  # base64 of {"a": 1}
    assert payload["record"]["metrics"]["nan"] == "NaN"
    assert decode(path.read_bytes())[1] == rec
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary files left
    assert spool.count() == 1 and spool.size_bytes() == path.stat().st_size


def test_entries_come_back_in_spool_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    ids = ["f" * 8, "0" * 8, "8" * 8, "a" * 8]  # not sorted: order must come from the spool time
    for rid in ids:
        spool.put(_record(record_id=rid))
    entries = spool.entries()
    assert [e.record_id for e in entries] == ids
    assert [spool.load(e) for e in entries] == [_record(record_id=rid) for rid in ids]
    spool.remove(ids[1])
    spool.remove(ids[1])  # already gone: fine
    assert [e.record_id for e in spool.entries()] == [ids[0], ids[2], ids[3]]


def test_put_of_the_same_record_replaces_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    rec = _record()
    spool.put(rec)
    spool.put(rec)
    assert spool.count() == 1


def test_unreadable_files_are_moved_aside(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    good = _record()
    spool.put(good)
    (tmp_path / "truncated.json").write_bytes(spool.directory.joinpath(f"{good.record_id}.json").read_bytes()[:50])
    other = _record()
    (tmp_path / "renamed.json").write_bytes(encode(other, 1))  # name does not match its record_id
    (tmp_path / "notes.txt").write_text("ignored")
    assert [e.record_id for e in spool.entries()] == [good.record_id]
    assert sorted(p.name for p in (tmp_path / CORRUPT_DIR).iterdir()) == ["renamed.json", "truncated.json"]
    assert spool.count() == 1


def test_reject_keeps_the_record_with_its_error(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    rec = _record()
    spool.put(rec)
    spool.reject(rec, "INVALID_PARAMETER_VALUE: nope")
    assert spool.count() == 0 and spool.rejected_count() == 1
    payload = _strict_json((tmp_path / REJECTED_DIR / f"{rec.record_id}.json").read_bytes())
    assert payload["error"] == "INVALID_PARAMETER_VALUE: nope"
    assert RunRecord.from_json(payload["record"]) == rec


def test_stale_temporary_files_are_cleaned_at_start(tmp_path: Path) -> None:
    stale, fresh = tmp_path / ".x.json.abc.tmp", tmp_path / ".y.json.def.tmp"
    stale.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    spool = Spool(tmp_path)
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a writer right now
    assert spool.count() == 0


def test_size_cap_raises_spool_error(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=3000)
    spool.put(_record())
    with pytest.raises(SpoolError, match="full"):
        spool.put(_record(artifacts={"big.bin": bytes(4000)}))
    assert spool.count() == 1


def test_read_only_directory_raises_spool_error(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    spool = Spool(directory)
    with read_only_dir(directory):
        with pytest.raises(SpoolError, match="cannot write spool file"):
            spool.put(_record())
        assert spool.count() == 0


def test_full_disk_raises_spool_error_and_leaves_no_partial_file(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    with tmpfs(directory, size="64k"):
        spool = Spool(directory, max_bytes=10**9)
        big = {"blob.bin": os.urandom(40_000)}  # base64 makes each file ~54 kB: the second does not fit
        spool.put(_record(artifacts=big))
        with pytest.raises(SpoolError, match="No space left"):
            spool.put(_record(artifacts=big))
        assert spool.count() == 1
        assert [p.name for p in directory.iterdir() if p.name.startswith(".")] == []


def test_missing_directory_is_empty_and_created_on_write(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "a" / "b")
    assert spool.count() == 0 and spool.entries() == []
    spool.put(_record())
    assert spool.count() == 1


# -- the logger module, without MLflow -----------------------------------------------------------
def test_importing_the_logger_does_not_import_mlflow() -> None:
    code = "import sys, exporters.mlflow_logger; assert 'mlflow' not in sys.modules, 'mlflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_file_store_needs_explicit_opt_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from exporters.mlflow_env import default_tracking_uri
    from exporters.mlflow_logger import MlflowLogger

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ValueError, match="MLFLOW_ALLOW_FILE_STORE"):
        MlflowLogger(tmp_path.as_uri(), "x", tmp_path / "spool")
    logger = MlflowLogger(None, "x", tmp_path / "state" / "spool")
    assert logger.tracking_uri == default_tracking_uri(tmp_path / "state")
    assert logger.tracking_uri.startswith("sqlite:////") and logger.tracking_uri.endswith("/state/mlflow.db")
    assert logger.artifact_location == (tmp_path / "state" / "mlartifacts").resolve().as_uri()
    assert logger.pending() == 0
    with pytest.raises(ValueError, match="experiment"):
        MlflowLogger(None, " ", tmp_path / "spool")


def test_http_limits_are_set_unless_the_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporters.mlflow_env import configure_mlflow_environment

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    configure_mlflow_environment()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "5"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"
    configure_mlflow_environment(http_timeout_s=2, http_max_retries=0)
    assert (os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"], os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) == ("2", "0")
    with pytest.raises(ValueError):
        configure_mlflow_environment(http_timeout_s=-1)

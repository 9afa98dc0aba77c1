"""Config: YAML + ICOS_AGENT_ environment overrides, errors naming the field, secrets from env only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.config.settings import admin_token, load_settings
from agent.core.durations import parse_duration
from agent.errors import UserError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "agent.yaml"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("ICOS_AGENT_"):
            monkeypatch.delenv(k)


def write(tmp_path: Path, data: object, name: str = "agent.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


BASE = {"model": {"path": "m.onnx"}, "bundle": {"path": "bundle"}}


def test_defaults_and_relative_paths(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, BASE))
    assert s.mode == "serve" and s.server.port == 8080 and s.windows.time == ["5m", "1h"] and s.windows.count == 1000
    assert s.model.path == tmp_path / "m.onnx" and s.bundle.path == tmp_path / "bundle"
    assert s.window_seconds == {"5m": 300.0, "1h": 3600.0}


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICOS_AGENT_SERVER__PORT", "9001")
    monkeypatch.setenv("ICOS_AGENT_MODE", "observe")
    monkeypatch.setenv("ICOS_AGENT_WINDOWS__TIME", '["1m"]')
    s = load_settings(write(tmp_path, {**BASE, "server": {"port": 7000, "host": "127.0.0.1"}}))
    assert s.server.port == 9001 and s.server.host == "127.0.0.1" and s.mode == "observe"
    assert s.windows.time == ["1m"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**BASE, "server": {"port": 70000}}, "agent.yaml: server.port: Input should be less than or equal to 65535"),
        ({**BASE, "server": {"prot": 1}}, "agent.yaml: server.prot: unknown field"),
        ({**BASE, "mode": "sidecar"}, "agent.yaml: mode: Input should be 'serve', 'proxy', 'observe' or 'fleet'"),
        ({**BASE, "windows": {"time": ["5 minutes"]}}, "windows.time: '5 minutes' is not a duration"),
        ({**BASE, "windows": {"time": ["5m", "300s"]}}, "windows.time: window '300s' is listed twice"),
        ({**BASE, "windows": {"count": 0}}, "windows.count: Input should be greater than or equal to 1"),
        ({**BASE, "upstream": {"url": "ftp://x"}}, "upstream.url: must be an http:// or https:// URL"),
        ({**BASE, "mode": "proxy"}, "upstream.url is required in proxy mode"),
        ({**BASE, "mode": "fleet"}, "fleet.prometheus_url is required in fleet mode"),
        ({**BASE, "fleet": {"prometheus_url": "prom:9090"}}, "fleet.prometheus_url: must be an http:// or https://"),
        ({**BASE, "fleet": {"selector": "job=x"}}, "fleet.selector: String should match pattern"),
        ({"bundle": {"path": "b"}}, "model.path is required in serve mode"),
        ({"model": {"path": "m.onnx"}}, "bundle.path is required"),
        ({**BASE, "model": {"path": "m", "name": "a b"}}, "model.name: String should match pattern"),
        ({**BASE, "server": {"port": 1, "metrics_port": 1}}, "server.metrics_port must differ"),
        ({**BASE, "admin_token": "x"}, "admin_token: secrets are read from the environment only"),
        ("- a\n- b\n", "agent.yaml: the top level must be a mapping"),
        ("a: [\n", "agent.yaml: not valid YAML"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(UserError) as info:
        load_settings(write(tmp_path, data))
    assert message in str(info.value)


def test_env_error_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICOS_AGENT_SERVER__THREADS", "zero")
    with pytest.raises(UserError) as info:
        load_settings(write(tmp_path, BASE))
    text = str(info.value)
    assert "server.threads" in text and "ICOS_AGENT_SERVER__THREADS" in text


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="config file not found"):
        load_settings(tmp_path / "nope.yaml")


def test_admin_token_from_env_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert admin_token() is None
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", "t0k")
    assert admin_token() == "t0k"
    load_settings(write(tmp_path, BASE))  # the token is not a settings field and does not break validation


def test_durations() -> None:
    assert parse_duration("90s") == 90 and parse_duration("5m") == 300 and parse_duration("1.5h") == 5400
    assert parse_duration("1d") == 86400 and parse_duration("250ms") == 0.25
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_shipped_example_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(EXAMPLE)
    assert s.mode == "serve"
    fields = set(yaml.safe_load(EXAMPLE.read_text()))
    assert {"mode", "model", "bundle", "server", "upstream", "windows", "metrics", "observe", "state_dir"} <= fields


def test_admin_token_loses_the_newline_a_secret_file_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", "t0k\n")
    assert admin_token() == "t0k"
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", " \n")
    assert admin_token() is None

"""Agent settings for the shipped MNIST CNN and a bundle: one builder for the in-process agent
(:func:`mnist_settings`, :func:`mnist_app`) and the subprocess's YAML (:func:`mnist_config`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from agent.config.settings import AgentSettings, load_settings
from agent.model.classifier import default_model_path

#: Two time windows and a count window large enough for every test.
WINDOWS_5M_1H = {"time": ["5m", "1h"], "count": 100000}


def mnist_config(
    bundle: Path,
    mode: str = "serve",
    *,
    state: Path | None = None,
    model: Mapping[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """Settings as a mapping: ``mode``, the model (by default ``mnist`` from the shipped CNN's file;
    ``model`` replaces it), ``bundle``, ``state`` as ``state_dir`` when given, and further sections
    (``server={...}``, ``windows={...}``)."""
    cfg: dict[str, Any] = {
        "mode": mode,
        "model": dict(model) if model is not None else {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(bundle)},
        **sections,
    }
    if state is not None:
        cfg["state_dir"] = str(state)
    return cfg


def mnist_settings(bundle: Path, mode: str = "serve", **kw: Any) -> AgentSettings:
    """:func:`mnist_config`, validated (``ICOS_AGENT_*`` environment overrides apply)."""
    return load_settings(None, **mnist_config(bundle, mode, **kw))


def mnist_app(bundle: Path, mode: str = "serve", **kw: Any) -> Any:
    """The agent's ASGI app for :func:`mnist_settings`, with a registry of its own."""
    from agent.server.app import create_app

    return create_app(mnist_settings(bundle, mode, **kw), CollectorRegistry())


def stateful_settings(bundle: Path, state: Path | None, mode: str = "serve", **sections: Any) -> AgentSettings:
    """:func:`mnist_settings` with a state directory (None: none) and the windows 5m, 1h and last100000."""
    return mnist_settings(bundle, mode, state=state, windows=WINDOWS_5M_1H, **sections)


def observe_app(bundle: Path, server: Mapping[str, Any] | None = None, **observe: Any) -> Any:
    """An observe-mode agent's app (no model file; events pair within 30 s unless ``observe`` says
    otherwise; ``server`` settings when given)."""
    return mnist_app(
        bundle,
        "observe",
        model={"name": "mnist"},
        server=dict(server or {}),
        observe={"event_ttl_seconds": 30, **observe},
        windows={"time": ["5m"], "count": 100000},
    )


def upstream_app(bundle: Path) -> Any:
    """A serve-mode agent named ``mnist-upstream``: the upstream V2 server of a proxy-mode agent."""
    return mnist_app(bundle, model={"name": "mnist-upstream", "path": str(default_model_path())})

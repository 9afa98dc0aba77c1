"""``icos-agent serve --config agent.yaml``: run the sidecar (Open Inference Protocol V2 + metrics).

SIGTERM (or Ctrl-C) stops accepting connections, finishes the requests in flight, drains or saves
pending work, flushes state and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import socket
from typing import TYPE_CHECKING, Any

from agent.errors import UserError

if TYPE_CHECKING:
    from agent.config.settings import AgentSettings


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="run the sidecar (serve/proxy/observe: V2 inference, live estimates, /metrics) or the fleet evaluator",
    )
    p.add_argument("--config", help="YAML config (see deploy/examples/agent.yaml); ICOS_AGENT_* env vars override it")
    p.add_argument("--host", help="override server.host")
    p.add_argument("--port", type=int, help="override server.port")
    p.add_argument("--check", action="store_true", help="validate the config, load model and bundle, then exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    # lazy: keeps fastapi, pydantic and numpy (and logging, ~40 ms) out of CLI start-up
    from agent.config.settings import load_settings
    from agent.core import logs
    from agent.server.app import create_app
    from agent.server.http_protocol import bounded_protocol

    settings = load_settings(args.config)
    if args.host:
        settings.server.host = args.host
    if args.port:
        settings.server.port = args.port
    logs.setup(settings.log_level)
    if settings.mode == "fleet":
        return _serve_fleet(settings, check=args.check)
    app = create_app(settings)
    limit_blas_threads(settings.server.blas_threads)
    if args.check:
        print(f"config OK: {settings.mode} mode, model {settings.model.name} version {settings.model.version}")
        return 0
    http = bounded_protocol(
        settings.server.header_timeout_seconds,
        settings.server.max_head_bytes,
        on_refused=app.state.agent.metrics.connection_refused,
        body_timeout=settings.server.body_timeout_seconds,
    )
    sockets = None
    if settings.server.admin_port is not None:
        if settings.server.admin_port in (settings.server.port, settings.server.metrics_port):
            raise UserError("server.admin_port must differ from server.port and server.metrics_port")
        # One server, two listening sockets: requests carry the port they arrived on (scope["server"]),
        # which is how the app keeps the admin API on its own port.
        sockets = [listen(settings.server.host, port) for port in (settings.server.port, settings.server.admin_port)]
    return run_uvicorn(
        app,
        settings,
        sockets,
        http=http,
        limit_concurrency=settings.server.limit_concurrency,
        timeout_keep_alive=settings.server.timeout_keep_alive_seconds,
        backlog=2048,
    )


def run_uvicorn(app: Any, settings: AgentSettings, sockets: list[socket.socket] | None = None, **extra: Any) -> int:
    """Serve ``app`` with uvicorn on ``server.host:server.port`` (or ``sockets``) until SIGTERM/SIGINT;
    0 once it has served and shut down gracefully, 1 when it never started. ``extra`` goes to
    ``uvicorn.Config``."""
    import uvicorn

    from agent.core import logs

    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_config=logs.uvicorn_log_config(settings.log_level),
        access_log=settings.server.access_log,
        timeout_graceful_shutdown=int(max(1, settings.server.graceful_timeout_seconds)),
        lifespan="on",
        **extra,
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal it handled after a graceful shutdown; a no-op handler turns that
    # into a normal return, so SIGTERM ends with exit status 0 once state is flushed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=sockets)
    return 0 if server.started else 1


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host is), as uvicorn would bind it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def _serve_fleet(settings: AgentSettings, *, check: bool) -> int:
    """``mode: fleet``: the fleet evaluator (:mod:`agent.fleet`) on ``server.host:server.port``."""

    from agent.fleet.app import create_fleet_app

    app = create_fleet_app(settings)
    if check:
        print(f"config OK: fleet mode, model {settings.model.name}, Prometheus API {settings.fleet.prometheus_url}")
        return 0
    return run_uvicorn(app, settings)


def limit_blas_threads(n: int) -> list[dict[str, object]]:
    """Cap numpy's BLAS thread pool (OpenBLAS, MKL, BLIS) at ``n`` threads for the whole process.

    The request path's products (the input PCA error, ``[batch, D] × [D, 11]``) are too small to
    gain from threads, and idle BLAS threads busy-wait after every call: with OpenBLAS's default of
    one thread per core they doubled the agent's CPU per batch-32 request. Returns the BLAS pools
    found, after the change (``threadpoolctl.threadpool_info`` entries)."""
    from threadpoolctl import threadpool_info, threadpool_limits  # lazy: keeps threadpoolctl out of CLI start-up

    threadpool_limits(limits=n, user_api="blas")
    return [i for i in threadpool_info() if i.get("user_api") == "blas"]

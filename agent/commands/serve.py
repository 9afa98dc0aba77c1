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
    from agent.core.state_lock import StateDirLock
    from agent.server.app import create_app
    from agent.server.http_protocol import bounded_protocol
    from agent.server.listeners import bind_listeners

    settings = load_settings(args.config)
    if args.host:
        settings.server.host = args.host
    if args.port:
        settings.server.port = args.port
    logs.setup(settings.log_level)
    if settings.mode == "fleet":
        return _serve_fleet(settings, check=args.check)
    # Everything that can stop the start happens before anything says ready, each ending it with one
    # line naming the problem: the state directory held by another agent, a port in use, the model
    # or bundle unreadable (create_app loads them). The ports stay bound from here on.
    lock = StateDirLock(settings.state_dir) if settings.state_dir is not None else None
    listeners = None
    try:
        if lock is not None:
            lock.acquire()
        listeners = bind_listeners(settings)
        app = create_app(settings, listeners=listeners)
        limit_blas_threads(settings.server.blas_threads)
        if args.check:
            print(
                f"config OK: {settings.mode} mode, model {settings.model.name} version {settings.model.version}; "
                f"{_free(settings)}"
            )
            return 0
        http = bounded_protocol(
            settings.server.header_timeout_seconds,
            settings.server.max_head_bytes,
            on_refused=app.state.agent.metrics.connection_refused,
            body_timeout=settings.server.body_timeout_seconds,
        )
        # One server, one or two listening sockets: requests carry the port they arrived on
        # (scope["server"]), which is how the app keeps the admin API on server.admin_port.
        return run_uvicorn(
            app,
            settings,
            listeners.http,
            http=http,
            limit_concurrency=settings.server.limit_concurrency,
            timeout_keep_alive=settings.server.timeout_keep_alive_seconds,
            backlog=2048,
        )
    finally:
        if listeners is not None:
            listeners.close()
        if lock is not None:
            lock.release()


def _free(settings: AgentSettings) -> str:
    """What ``--check`` found free besides the config: the ports, and the state directory."""
    srv = settings.server
    ports = [p for p in (srv.port, srv.admin_port, srv.metrics_port, srv.grpc_port) if p is not None]
    text = f"port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))} free on {srv.host}"
    return text + (f"; state_dir {settings.state_dir} not in use" if settings.state_dir is not None else "")


def run_uvicorn(app: Any, settings: AgentSettings, sockets: list[socket.socket] | None = None, **extra: Any) -> int:
    """Serve ``app`` with uvicorn on ``sockets`` (bound by the caller; else ``server.host:server.port``,
    bound here first) until SIGTERM/SIGINT; 0 once it has served and shut down gracefully, 1 when it
    never started. A :class:`UserError` that ended the application's start is raised once uvicorn
    has exited, so it is the last line. ``extra`` goes to ``uvicorn.Config``."""
    import uvicorn

    from agent.core import logs
    from agent.server.listeners import listen

    own = sockets is None
    sockets = sockets if sockets is not None else [listen(settings.server.host, settings.server.port)]
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
    try:
        server.run(sockets=sockets)
    finally:
        if own:
            for sock in sockets:
                sock.close()
    failure = getattr(getattr(app, "state", None), "start_failure", None)
    if not server.started and isinstance(failure, UserError):
        raise failure
    return 0 if server.started else 1


def _serve_fleet(settings: AgentSettings, *, check: bool) -> int:
    """``mode: fleet``: the fleet evaluator (:mod:`agent.fleet`) on ``server.host:server.port``."""

    from agent.fleet.app import create_fleet_app
    from agent.server.listeners import listen

    sock = listen(settings.server.host, settings.server.port)  # a port in use ends the start here
    try:
        app = create_fleet_app(settings)
        if check:
            print(
                f"config OK: fleet mode, model {settings.model.name}, Prometheus API {settings.fleet.prometheus_url}; "
                f"port {settings.server.port} free on {settings.server.host}"
            )
            return 0
        return run_uvicorn(app, settings, [sock])
    finally:
        sock.close()


def limit_blas_threads(n: int) -> list[dict[str, object]]:
    """Cap numpy's BLAS thread pool (OpenBLAS, MKL, BLIS) at ``n`` threads for the whole process.

    The request path's products (the input PCA error, ``[batch, D] × [D, 11]``) are too small to
    gain from threads, and idle BLAS threads busy-wait after every call: with OpenBLAS's default of
    one thread per core they doubled the agent's CPU per batch-32 request. Returns the BLAS pools
    found, after the change (``threadpoolctl.threadpool_info`` entries)."""
    from threadpoolctl import threadpool_info, threadpool_limits  # lazy: keeps threadpoolctl out of CLI start-up

    threadpool_limits(limits=n, user_api="blas")
    return [i for i in threadpool_info() if i.get("user_api") == "blas"]

"""The agent's kinds of error, and the whole tree of its exception types.

Every exception type the agent defines derives from one of the kinds below, so a caller can tell what
went wrong from the kind alone:

* :class:`UserError` — a mistake in arguments, files or configuration: the CLI prints it as one
  line (exit 2), never a traceback.
* :class:`ClientError` — a request the client must fix: it also carries the HTTP ``status`` to answer
  and the bounded ``reason`` counted in ``icos_invalid_requests_total``. Subclasses declare theirs as
  class attributes (e.g. :class:`agent.protocol.inference.ProtocolError`); an instance may override them.
* :class:`Unavailable` — something the agent relies on cannot serve now: its own capacity, the
  prediction store, the upstream model server, the fleet's metrics API. Nobody's mistake; a later try
  may succeed.
* :class:`DamagedData` — data the agent stored itself is found damaged: it is set aside and counted,
  and never blamed on a client.
* :class:`Abort` — no mistake at all: work abandoned from inside a callback (a request past a limit of
  the server, SIGTERM during the demo), caught by the code that installed the callback.

``agent/server/errors.py`` is the one table from these types to HTTP and gRPC answers. ``invariants``
and ``exporters`` cannot import the agent: their types derive from Python's and are drawn here too
(:func:`user_error_types` lists those whose message is meant for a person). The tree, each type with
its module (``tests/unit/test_error_tree.py`` draws it from the code and fails when this copy differs)::

    Exception
    ├── UserError                           agent.errors
    │   ├── ClientError                     agent.errors
    │   │   ├── MetadataTooLarge            agent.dataplane.admission
    │   │   ├── PendingFull                 agent.dataplane.observe
    │   │   ├── RecalibrationRefused        agent.labels.recalibration
    │   │   ├── PredictionNotStored         agent.labels.service
    │   │   ├── InvalidInput (ValueError)   agent.model.inputs
    │   │   └── ProtocolError (ValueError)  agent.protocol.inference
    │   ├── AuditError (ValueError)         agent.audits.report
    │   │   ├── NotApplicable               agent.audits.mutation.operators
    │   │   └── AuditTimeout                agent.audits.runner
    │   │       └── AgentStopping           agent.server.audit_jobs
    │   ├── StateDirInUse                   agent.core.state_lock
    │   ├── DataError (ValueError)          agent.data.limits
    │   │   └── DataLimitError              agent.data.limits
    │   ├── BadOutput                       agent.dataplane.challenger.pairing
    │   ├── ModelLoadError (ValueError)     agent.model.classifier
    │   ├── ViewError (ValueError)          agent.model.views
    │   └── PortUnavailable                 agent.server.listeners
    ├── Unavailable                         agent.errors
    │   ├── UpstreamError                   agent.dataplane.upstream
    │   ├── RefreshError                    agent.fleet.prometheus_api
    │   │   ├── QueryError                  agent.fleet.prometheus_api
    │   │   └── RefusedAnswer               agent.fleet.stat_schema
    │   ├── StoreUnavailable                agent.labels.backend
    │   │   └── StoreUnreachable            agent.labels.backend
    │   └── ServerBusy                      agent.server.body_budget
    ├── DamagedData                         agent.errors
    │   ├── DamagedFile                     agent.core.sqlite_files
    │   └── CorruptRow (ValueError)         agent.labels.rows
    ├── Abort                               agent.errors
    │   ├── _Terminated                     agent.demo.story
    │   ├── HeadTooLarge                    agent.server.http_protocol
    │   └── BodyTooLarge                    agent.server.middleware
    ├── _Unavailable                        exporters.mlflow_logger
    └── SpoolError                          exporters.spool
    ValueError
    ├── BundleError                         invariants.bundle
    ├── FitParamsError                      invariants.fit_params
    ├── IdiRuleError                        invariants.idi
    └── OnnxLoadError                       invariants.onnx_session
    yaml.error.YAMLError
    └── YamlAliasError                      invariants.untrusted

This module sits at the bottom of the agent's layers: it imports only the ``invariants`` library, so
that :func:`user_error_types` needs no lazy import.
"""

from __future__ import annotations

from collections.abc import Mapping

from invariants.bundle import BundleError
from invariants.idi import IdiRuleError
from invariants.onnx_session import OnnxLoadError


class UserError(Exception):
    """A mistake in arguments, files or configuration, explained in one line."""


class ClientError(UserError):
    """A request the client must fix: answered with ``status`` and counted under ``reason``."""

    status: int = 400
    reason: str = "invalid"
    #: Extra response headers, e.g. ``Retry-After`` of a 429.
    headers: Mapping[str, str] | None = None

    def __init__(
        self,
        message: str = "",
        *,
        status: int | None = None,
        reason: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if reason is not None:
            self.reason = reason
        if headers is not None:
            self.headers = headers


class Unavailable(Exception):
    """Something the agent relies on cannot serve now (the message says what): retry later."""


class DamagedData(Exception):
    """Data the agent stored itself is damaged (the message says how): set it aside, start anew."""


class Abort(Exception):
    """Work abandoned from inside a callback, caught by the code that installed it: not an error to report."""


def user_error_types() -> tuple[type[BaseException], ...]:
    """Every exception type whose message is meant for the user (the agent's own derive from
    :class:`UserError`; the ``invariants`` library and the OS have theirs)."""
    return (
        UserError,
        BundleError,
        IdiRuleError,
        OnnxLoadError,
        FileNotFoundError,
        PermissionError,
        IsADirectoryError,
    )

"""How predictions reach the agent: the ``server`` section (its ports and the bounds on what a request may
hold), ``upstream`` (the model server of proxy mode) and ``observe`` (the CloudEvents of observe mode)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from agent.config.section import Section


class ServerConfig(Section):
    host: str = "0.0.0.0"  # noqa: S104 - a sidecar listens on the pod network
    """listen address"""

    port: int = Field(8080, ge=1, le=65535)
    """port of the V2 API, `/v1/*` and `/metrics`"""

    metrics_port: int | None = Field(None, ge=1, le=65535)
    """optional second port serving only `/metrics` (must differ from `port`)"""

    admin_port: int | None = Field(None, ge=1, le=65535)
    """a port of its own for the admin API (reload, recalibrate, triggered audits): when set, those endpoints answer
    only there (404 on server.port) and that port answers only them and the health checks, so a NetworkPolicy can
    admit its callers alone; null keeps them on server.port"""

    grpc_port: int | None = Field(None, ge=1, le=65535)
    """port of the Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`, serve and proxy modes;
    8081 is the usual choice beside Triton's and KServe's); null: HTTP only. Request messages are bounded by
    `server.max_body_bytes`"""

    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    """larger request bodies are rejected with 413"""

    max_inflight_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    """bytes of request bodies (HTTP) and messages (gRPC) held at once; a request that does not fit is answered 503
    with `Retry-After` (`icos_connections_refused_total{reason="bytes_in_flight"}`), so a burst of large requests
    cannot hold gigabytes; one request always fits an idle server"""

    max_batch: int = Field(1024, ge=1)
    """larger batches are rejected with 413"""

    max_tensor_elements: int = Field(1 << 24, ge=1)
    """larger request tensors are rejected with 413"""

    threads: int = Field(8, ge=1, le=256)
    """thread pool for decoding, inference and judging"""

    blas_threads: int = Field(1, ge=1, le=256)
    """threads of numpy's BLAS in the serve process (its products on the request path are small; more threads mostly
    spin and take CPU from inference)"""

    graceful_timeout_seconds: float = Field(20.0, gt=0)
    """on SIGTERM: time allowed for requests in flight and pending work"""

    access_log: bool = False
    """one JSON log line per request"""

    max_metadata_value_bytes: int = Field(1024, ge=1, le=1 << 20)
    """a longer value of a per-sample metadata input (IDI) is rejected with 413 (`metadata_too_large`)"""

    limit_concurrency: int = Field(512, ge=1, le=1_000_000)
    """open HTTP connections beyond which a new connection is answered 503 with `Retry-After` and closed at once
    (uvicorn also answers 503 to requests while as many are in progress); keep it below the process's file
    descriptor limit"""

    timeout_keep_alive_seconds: int = Field(5, ge=1, le=3600)
    """an idle keep-alive connection is closed after this time"""

    header_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    """a connection that has not sent a complete request head this long after it opened (or after its request's first
    byte) is closed"""

    body_timeout_seconds: float = Field(60.0, gt=0, le=3600)
    """a request body not complete this many seconds after its head closes the connection
    (icos_connections_refused_total{reason="body_timeout"}); bounds how long a client that dribbles its body holds
    a request slot; a gRPC request message not read within it is answered `DEADLINE_EXCEEDED`
    (icos_invalid_requests_total{reason="body_timeout"})"""

    max_head_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """a larger request head (request line and headers) is answered 431 and its connection closed"""


class UpstreamConfig(Section):
    url: str | None = None
    """proxy mode: base URL of the upstream V2 server"""

    model_name: str | None = None
    """the model's name on the upstream (default: `model.name`)"""

    timeout_seconds: float = Field(10.0, gt=0, le=600)
    """one deadline for the whole upstream call (waiting for a pooled connection, connecting, sending, reading the
    whole answer); a slower call answers 504"""

    scores_output: str | None = None
    """the upstream output (or observed tensor) holding the class scores"""

    max_response_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1 << 32)
    """largest upstream answer the agent reads (its declared length and the bytes streamed); a larger one answers 502
    and is never buffered past this"""

    ready_interval_seconds: float = Field(2.0, ge=0.05, le=300)
    """how often the agent asks the upstream whether its model is ready (`GET
    /v2/models/{upstream.model_name}/ready`, in the background); the agent's own readiness (`/v2/health/ready`,
    gRPC `ServerReady`/`ModelReady`) follows the last answer"""

    ready_timeout_seconds: float = Field(1.0, gt=0, le=60)
    """bound on one readiness check of the upstream: no 200 within it counts as not ready"""

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/") if v else v


class ObserveConfig(Section):
    queue_size: int = Field(1000, ge=1)
    """observe batches waiting to be judged; when full the agent answers 429"""

    event_ttl_seconds: float = Field(60.0, gt=0)
    """how long a CloudEvent waits for its request/response pair"""

    event_buffer: int = Field(10_000, ge=1)
    """unpaired CloudEvents kept at most"""

    max_pending_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """bytes of decoded CloudEvents waiting for their pair; an event that would pass it is refused with 429 and
    `Retry-After`, so unpaired events cannot fill the pod's memory"""

    max_metadata_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """per-sample metadata of one observation or request event, counted as numpy stores it (samples × longest value,
    summed over fields); refused with 413 before it is allocated"""

    workers: int = Field(1, ge=1, le=32)
    """tasks judging observed batches"""

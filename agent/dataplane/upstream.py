"""The upstream V2 server of proxy mode: :class:`UpstreamClient` calls it, :class:`UpstreamModel` holds
what its server and model metadata say.

The upstream is called with :mod:`aiohttp` (one pooled session, made in the agent's event loop on first
use; this module is its only user: its client costs about a sixth of httpx's CPU per call, and in proxy
mode that cost is added to every prediction). Each call has ONE deadline,
``upstream.timeout_seconds``, over the whole exchange: waiting for a pooled connection, connecting,
sending, and reading the whole answer; an upstream that dribbles its answer cannot hold a request (or
a pooled connection) past it. The answer is streamed under ``upstream.max_response_bytes`` (its
declared length is checked first), so a huge answer is refused without being buffered.

Readiness checks (:meth:`UpstreamClient.model_ready`) use a session of their own, one fresh connection
per check, each bounded by ``upstream.ready_timeout_seconds``.

Failures become :class:`UpstreamError`: unreachable or broken upstream → 502, timeout → 504, too
large → 502. A 4xx from the upstream (the client's mistake) is passed through with the upstream's
message (the first line of its JSON ``error``, sanitised and bounded). A 5xx answer's body is never
passed on (it may be a traceback): the client is told the status and its standard phrase, the log gets
a bounded excerpt. The connection that carried an error answer is closed, never pooled: servers such
as MLServer reset it right after a 500, and the next request on it would fail.
"""

from __future__ import annotations

import asyncio
import http
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from agent.core import logs
from agent.errors import Unavailable
from agent.protocol import v2

log = logs.get("proxy")

#: Bytes of an upstream error answer read (for the log, and a 4xx's message); the rest is dropped.
ERROR_BODY_BYTES = 4096
#: Characters of an upstream 4xx message passed to the client.
CLIENT_MESSAGE_CHARS = 200
#: Characters of an upstream error answer written to the log.
LOG_BODY_CHARS = 500
#: Largest server or model metadata document read from the upstream.
METADATA_BYTES = 1024 * 1024
#: Inputs or outputs of the upstream's model metadata kept (and advertised); the rest are dropped.
MAX_METADATA_TENSORS = 64
#: The V2 extension that lets tensors travel as raw bytes after the JSON header.
BINARY_EXTENSION = "binary_tensor_data"
#: Output names taken as the class scores when the upstream lists them (in this order).
SCORE_OUTPUT_NAMES = ("probabilities", "predict_proba")
#: Servers whose models list no outputs but answer a known scores output when it is requested:
#: MLServer's scikit-learn (and XGBoost/LightGBM) runtimes answer ``predict_proba``.
UNLISTED_SCORES = {"mlserver": "predict_proba"}
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")
_NAME = re.compile(r"[A-Za-z0-9_.:/\-]{1,128}")


class UpstreamError(Unavailable):
    """The upstream could not answer. ``reason`` is a bounded label for metrics."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class UpstreamModel:
    """What the upstream says about itself (``GET /v2``) and the model (``GET /v2/models/{name}``).

    ``read`` is false when it gave no usable metadata (an older or minimal V2 server): then requests
    travel as JSON, every output is asked for and the scores are recognised in the answer.
    """

    server_name: str = ""
    binary: bool = False
    inputs: tuple[dict[str, Any], ...] = ()
    outputs: tuple[dict[str, Any], ...] = ()
    scores_output: str | None = None
    read: bool = False

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]

    @classmethod
    def of(cls, server: Any, model: Any, configured_scores: str | None) -> UpstreamModel:
        """Build from the two metadata documents (``None`` or anything malformed: not known)."""
        server = server if isinstance(server, dict) else {}
        model = model if isinstance(model, dict) else {}
        name = server.get("name") if isinstance(server.get("name"), str) else ""
        extensions = server.get("extensions") if isinstance(server.get("extensions"), list) else []
        inputs = _tensors(model.get("inputs"))
        outputs = _tensors(model.get("outputs"))
        return cls(
            server_name=str(name)[:128],
            binary=BINARY_EXTENSION in extensions,
            inputs=inputs,
            outputs=outputs,
            scores_output=configured_scores or _scores_output(str(name), outputs),
            read=bool(server) and "inputs" in model,
        )


def _tensors(raw: Any) -> tuple[dict[str, Any], ...]:
    """The well-formed ``{name, datatype, shape}`` entries of a metadata list, bounded."""
    out: list[dict[str, Any]] = []
    for item in raw if isinstance(raw, list) else []:
        if len(out) >= MAX_METADATA_TENSORS:
            break
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not _NAME.fullmatch(item["name"]):
            continue
        datatype = item.get("datatype")
        shape = item.get("shape")
        out.append(
            {
                "name": item["name"],
                "datatype": datatype if isinstance(datatype, str) and datatype in v2.DATATYPES else "FP32",
                "shape": [d for d in shape if isinstance(d, int)][: v2.MAX_RANK] if isinstance(shape, list) else [-1],
            }
        )
    return tuple(out)


def _scores_output(server_name: str, outputs: tuple[dict[str, Any], ...]) -> str | None:
    """The output to request as the class scores: a known name, else the one floating-point output,
    else (no outputs listed) what the server kind is known to answer; ``None`` when it cannot be told."""
    names = [o["name"] for o in outputs]
    for known in SCORE_OUTPUT_NAMES:
        if known in names:
            return known
    floats = [o["name"] for o in outputs if o["datatype"].startswith("FP")]
    if len(floats) == 1:
        return floats[0]
    if not outputs:
        return UNLISTED_SCORES.get(server_name.lower())
    return None


#: Idle pooled connections are dropped after this long: under the keep-alive of common servers (uvicorn's,
#: behind MLServer and KServe, is 5 s), so the agent does not reuse one the upstream is closing.
KEEPALIVE_SECONDS = 2.0


class UpstreamClient:
    """One pooled HTTP client for the upstream; every call is bounded in time and memory."""

    def __init__(
        self,
        base_url: str,
        timeout_seconds: float,
        max_connections: int = 64,
        max_response_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.max_response_bytes = max_response_bytes
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        """The pooled session, made on first use (inside the running event loop, as aiohttp wants).
        Its own total timeout is a backstop; the deadline over the whole call is :meth:`_bounded`'s."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, use_dns_cache=True, keepalive_timeout=KEEPALIVE_SECONDS
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout_seconds * 2),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    def _probe_client(self) -> aiohttp.ClientSession:
        """The session of readiness checks: a fresh connection per check (a stale pooled connection
        left from before an upstream restart would fail a ready upstream's check) and never one of the
        inference pool (64 slow calls holding it must not make a ready upstream look unready)."""
        if self._probe_session is None:
            self._probe_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2, force_close=True),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
        return self._probe_session

    async def model_ready(self, model_name: str, timeout_seconds: float) -> str | None:
        """Ask the upstream whether ``model_name`` is ready (``GET /v2/models/{name}/ready``): ``None`` when
        it answers 200 within ``timeout_seconds``, else why not, in a few words. Nothing is logged or
        counted here (a check runs every few seconds; the caller logs changes)."""
        url = f"{self.base_url}/v2/models/{model_name}/ready"
        try:
            async with asyncio.timeout(timeout_seconds):
                async with self._probe_client().get(url, headers={"Accept-Encoding": "identity"}) as resp:
                    await resp.content.read(ERROR_BODY_BYTES)  # bounded; the connection is closed anyway
                    return None if resp.status == 200 else f"its model {model_name!r} answered {resp.status}"
        except TimeoutError:
            return f"no answer within {timeout_seconds:g} s (upstream.ready_timeout_seconds)"
        except (aiohttp.ClientError, OSError) as exc:
            return f"unreachable ({type(exc).__name__})"

    async def infer(self, model_name: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, str | None]:
        """POST a V2 request; returns the response body and its ``Inference-Header-Content-Length``."""
        url = f"{self.base_url}/v2/models/{model_name}/infer"
        return await self._bounded(self._exchange("POST", url, body, headers, self.max_response_bytes))

    async def metadata(self, model_name: str, configured_scores: str | None) -> UpstreamModel:
        """Read the server and model metadata. A document the upstream does not serve (404) or that
        is not JSON counts as absent; an unreachable or failing upstream raises :class:`UpstreamError`."""
        docs: list[Any] = []
        for path in ("/v2", f"/v2/models/{model_name}"):
            try:
                body, _ = await self._bounded(self._exchange("GET", self.base_url + path, b"", {}, METADATA_BYTES))
            except UpstreamError as exc:
                if exc.reason not in ("client_error", "too_large"):
                    raise
                docs.append(None)
                continue
            try:
                docs.append(json.loads(body))
            except (ValueError, UnicodeDecodeError):
                docs.append(None)
        return UpstreamModel.of(docs[0], docs[1], configured_scores)

    async def _bounded(self, call: Any) -> tuple[bytes, str | None]:
        try:
            async with asyncio.timeout(self.timeout_seconds):
                return await call  # type: ignore[no-any-return]
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors too
            raise UpstreamError(
                504, "timeout", f"upstream {self.base_url} did not answer within {self.timeout_seconds:g} s"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                502, "unreachable", f"upstream {self.base_url} is unreachable: {type(exc).__name__}: {exc}"
            ) from exc

    async def _exchange(
        self, method: str, url: str, body: bytes, headers: Mapping[str, str], cap: int
    ) -> tuple[bytes, str | None]:
        # identity: a compressed answer could expand far past the bytes counted on the wire
        headers = {**headers, "Accept-Encoding": "identity"}
        try:
            resp = await self._client().request(method, url, data=body or None, headers=headers)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            # a pooled connection the upstream closed as it was reused (no answer began): once more, on
            # a new one; a second failure is the upstream's
            resp = await self._client().request(method, url, data=body or None, headers=headers)
        try:
            if resp.status >= 400:
                if resp.connection is not None and resp.connection.protocol is not None:
                    # aiohttp pools a connection as soon as its answer is read: mark this one first
                    resp.connection.protocol.force_close()
                raise _status_error(resp.status, await resp.content.read(ERROR_BODY_BYTES))
            declared = resp.content_length
            if declared is not None and declared > cap:
                raise self._too_large(cap, f"it declares {declared} bytes")
            content = await _read_capped(resp, cap)
            if content is None:
                raise self._too_large(cap, "it streamed more")
        except BaseException:
            # an answer not read to its end (an error, too large, cancelled) closes its connection
            # instead of pooling it: the server may be about to reset it
            resp.close()
            raise
        resp.release()
        return content, resp.headers.get(v2.HEADER_LENGTH)

    @staticmethod
    def _too_large(cap: int, what: str) -> UpstreamError:
        return UpstreamError(
            502, "too_large", f"upstream answer is larger than upstream.max_response_bytes ({cap} bytes): {what}"
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._probe_session is not None:
            await self._probe_session.close()
            self._probe_session = None


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The whole answer read chunk by chunk, or ``None`` as soon as it passes ``cap`` bytes."""
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        if len(buf) + len(chunk) > cap:
            return None
        buf += chunk
    return bytes(buf)


def _status_error(status: int, body: bytes) -> UpstreamError:
    """A 4xx passes the upstream's JSON ``error`` (first line, sanitised); a 5xx only its status and
    standard phrase, the body (possibly a traceback) goes to the log, bounded."""
    text = body.decode("utf-8", "replace")
    if 400 <= status < 500:
        message = _client_message(text)
        detail = f": {message}" if message else ""
        return UpstreamError(status, "client_error", f"upstream rejected the request ({status}){detail}")
    log.warning(
        "upstream answered an error",
        extra={"status": status, "body": _UNPRINTABLE.sub(" ", text[:LOG_BODY_CHARS])},
    )
    try:
        phrase = f" {http.HTTPStatus(status).phrase}"
    except ValueError:
        phrase = ""
    return UpstreamError(
        502, "bad_status", f"upstream answered {status}{phrase}; its body is not passed on (see the agent's log)"
    )


def _client_message(text: str) -> str:
    """The first line of a JSON ``{"error": "..."}``, printable ASCII, bounded; '' for anything else."""
    try:
        obj = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(obj, dict) or not isinstance(obj.get("error"), str):
        return ""
    lines = obj["error"].strip().splitlines()
    first = lines[0] if lines else ""
    if first.startswith("Traceback"):
        return ""
    return _UNPRINTABLE.sub("?", first)[:CLIENT_MESSAGE_CHARS]

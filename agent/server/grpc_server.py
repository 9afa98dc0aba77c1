"""The Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``) on ``server.grpc_port``:
the one module that imports ``grpc``.

It is a ``grpc.aio`` server in the agent's own event loop, beside uvicorn: handlers are coroutines, so
a connection or a call costs no thread; the model runs in the agent's bounded worker threads
(``server.threads``) exactly as for HTTP, and at most ``server.limit_concurrency`` calls run at once
(beyond that gRPC answers ``RESOURCE_EXHAUSTED``). A request message is decoded straight into an
:class:`~agent.protocol.inference.InferRequest` (:mod:`agent.protocol.v2_grpc`) and answered by the
dataplane, as HTTP requests are: validation, limits, verdicts (``icos_verdict``), metrics and judging
are the same, and errors are answered from :data:`agent.server.errors.ERROR_TABLE` (its
``grpc_code``) and counted there.

Message size: a request message larger than ``server.max_body_bytes`` is refused with
``RESOURCE_EXHAUSTED`` and counted under ``icos_invalid_requests_total{reason="too_large"}``. To count
it, the handler receives the serialised message and checks its size before parsing it; gRPC's own
receive limit (:func:`receive_limit`) is the bound plus an eighth (at least 64 KiB), so no message over that
is ever buffered (those are refused by gRPC's transport with the same status, before the agent sees them,
and are not counted).

Admission before reading: grpc-python reads a unary call's whole message before its handler runs, so 16
concurrent calls of 32 MB were held (twice: the transport's buffer and its bytes) before any could be
refused. ``ModelInfer`` is therefore served as a client-streaming handler, which gRPC's wire cannot tell
from a unary one and whose message is read only when the handler asks: the call first takes what reading a
message of the receive limit costs (:data:`READ_COPIES` copies of it) from the server's budget of bytes in
flight (``server.max_inflight_bytes``, shared with HTTP bodies), waiting for room up to :data:`ROOM_WAIT_SECONDS`
in turn (first come, first served: bytes given back are taken for the oldest waiting call that fits, so they
do not wake every waiting call; then ``UNAVAILABLE``, counted under
``icos_connections_refused_total{reason="bytes_in_flight"}``, as HTTP answers 503); it then reads the message (within
``server.body_timeout_seconds``: else ``DEADLINE_EXCEEDED``, ``reason="body_timeout"``) and keeps what the
message and its parsed copy hold (twice its size; only that counts towards a burst after which the heap is
trimmed, :mod:`agent.server.body_budget`). A message not yet read waits in the transport's flow
control window (BDP probing off, so that window stays small), not in memory. Serving a call this way costs
about 0.07 ms more CPU than a unary handler (measured on a minimal server).

The service is registered by hand (no generated ``_pb2_grpc`` module, which would import ``grpc`` too).
"""

from __future__ import annotations

import asyncio
import threading
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from agent import __version__
from agent.core import logs
from agent.dataplane.metadata import SERVER_EXTENSIONS, SERVER_NAME
from agent.dataplane.plane import DataPlane
from agent.errors import ClientError
from agent.protocol import v2_grpc
from agent.protocol.grpc_stubs import open_inference_grpc_pb2 as pb
from agent.server.body_budget import BodyBudget, ServerBusy
from agent.server.errors import HttpAnswer, answer_of
from agent.server.listeners import port_in_use_error
from exporters.prometheus import AgentMetrics

log = logs.get("grpc")

SERVICE = "inference.GRPCInferenceService"
#: How long a call waits for room in the budget before it is refused: as long as an HTTP request refused
#: for the same reason is told to wait before it retries (``Retry-After: 1``); reads of other calls' large
#: messages, which hold room only until their size is known, end well within it.
ROOM_WAIT_SECONDS = 1.0
#: What reading one message holds at once, in copies of it: grpc-python copies the transport's buffer into a
#: ``bytearray`` and that into the ``bytes`` it returns, before the buffer is let go. A reservation of fewer
#: let 16 concurrent calls of 32 MB peak at 536 MB with a budget of 256 MB (bench.hostile.serving,
#: ``burst-grpc``).
READ_COPIES = 3


def receive_limit(max_body_bytes: int) -> int:
    """gRPC's receive limit: the largest message read (those over ``server.max_body_bytes`` are read only to
    be counted as too large), an eighth over the bound, at least 64 KiB."""
    return max_body_bytes + max(64 * 1024, max_body_bytes // 8)


class GrpcService:
    """The V2 gRPC service of a dataplane; :meth:`bind` (first), :meth:`start` (last) and :meth:`stop`
    follow the agent's lifecycle.
    ``ready`` says whether the agent is ready (``ServerReady``, ``ModelReady``)."""

    def __init__(
        self,
        plane: DataPlane,
        metrics: AgentMetrics,
        ready: Callable[[], bool],
        max_body_bytes: int,
        limit_concurrency: int,
        budget: BodyBudget,
        body_timeout: float = 60.0,
    ) -> None:
        self.plane = plane
        self.budget = budget
        self.metrics = metrics
        self.ready = ready
        self.limit = max_body_bytes
        self.limit_concurrency = limit_concurrency
        self.body_timeout = body_timeout
        self.server: aio.Server | None = None
        self.port: int | None = None
        self.address = ""
        #: what a call takes from the budget before its message is read: what reading the largest message
        #: gRPC receives holds at once
        self.reserve = READ_COPIES * receive_limit(max_body_bytes)
        #: calls waiting for room, first come first served: each future is resolved once its reservation is
        #: taken on its behalf, so bytes given back wake one call that fits, not every waiting call
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        budget.on_give(self._wake)

    def bind(self, host: str, port: int) -> None:
        """Make the server and bind its port (it answers nothing until :meth:`start`); a port in use is
        a :class:`~agent.server.listeners.PortUnavailable` naming it, before anything else starts."""
        server = aio.server(
            options=[
                ("grpc.max_receive_message_length", receive_limit(self.limit)),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
                # a message not yet read stays in the sender (a window of 64 KB), not in this process
                ("grpc.http2.bdp_probe", 0),
            ],
            maximum_concurrent_rpcs=self.limit_concurrency,
        )
        server.add_generic_rpc_handlers((self._handlers(),))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = server.add_insecure_port(address)
        except RuntimeError:  # grpc's "Failed to bind to address"
            raise port_in_use_error(host, port, "server.grpc_port") from None
        self.server = server
        self.address = address

    async def start(self) -> None:
        """Answer calls on the port :meth:`bind` bound."""
        assert self.server is not None, "bind() first"
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        await self.server.start()
        log.info("gRPC V2 service listening", extra={"address": self.address})

    async def stop(self, grace: float) -> None:
        """Refuse new calls and let the ones in flight finish for up to ``grace`` seconds."""
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None

    def _handlers(self) -> grpc.GenericRpcHandler:
        def unary(fn: Callable[[Any, aio.ServicerContext], Awaitable[Any]], request: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=request.FromString if request is not None else None,
                response_serializer=lambda m: m.SerializeToString(),
            )

        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "ServerLive": unary(self.server_live, pb.ServerLiveRequest),
                "ServerReady": unary(self.server_ready, pb.ServerReadyRequest),
                "ModelReady": unary(self.model_ready, pb.ModelReadyRequest),
                "ServerMetadata": unary(self.server_metadata, pb.ServerMetadataRequest),
                "ModelMetadata": unary(self.model_metadata, pb.ModelMetadataRequest),
                # read by the handler once admitted, serialised: its size is checked before it is parsed
                "ModelInfer": grpc.stream_unary_rpc_method_handler(
                    self.model_infer, request_deserializer=None, response_serializer=lambda m: m.SerializeToString()
                ),
            },
        )

    async def _abort(self, context: aio.ServicerContext, exc: Exception) -> None:
        """End the call with the table's answer to ``exc`` (counted as HTTP counts it); raises."""
        await self._abort_with(context, answer_of(exc))

    async def _abort_with(self, context: aio.ServicerContext, answer: HttpAnswer) -> None:
        answer.count(self.metrics)
        await context.abort(grpc.StatusCode[answer.grpc_code], answer.message)

    async def server_live(self, _request: pb.ServerLiveRequest, _context: aio.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, _request: pb.ServerReadyRequest, _context: aio.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self.ready())

    async def server_metadata(self, _request: pb.ServerMetadataRequest, _context: aio.ServicerContext) -> Any:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=SERVER_EXTENSIONS)

    async def model_ready(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> Any:
        try:
            self.plane.runtimes.resolve(request.name, request.version or None)
            return pb.ModelReadyResponse(ready=self.ready())
        except Exception as exc:
            await self._abort(context, exc)

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: aio.ServicerContext) -> Any:
        try:
            return v2_grpc.metadata_message(await self.plane.model_metadata(request.name, request.version or None))
        except Exception as exc:
            await self._abort(context, exc)

    def _wake(self) -> None:
        """Bytes went back to the budget: the calls waiting for room take it in turn (on the loop)."""
        loop = self._loop
        if loop is None or not self._waiters:
            return
        if threading.get_ident() == self._loop_thread:
            self._grant()
        else:
            loop.call_soon_threadsafe(self._grant)

    def _grant(self) -> None:
        """Take reservations for the waiting calls, oldest first, while the budget has room for them."""
        waiters = self._waiters
        while waiters:
            if waiters[0].done():  # its wait timed out
                waiters.popleft()
                continue
            try:
                self.budget.take(self.reserve, reservation=True)
            except ServerBusy:
                return
            waiters.popleft().set_result(None)

    async def _take_room(self, context: aio.ServicerContext) -> int:
        """Take :attr:`reserve` bytes of the budget before the message is read, waiting for room, after the
        calls that waited before it, up to :data:`ROOM_WAIT_SECONDS` (or the call's deadline, if sooner; then
        :class:`ServerBusy`)."""
        assert self._loop is not None, "start() first"
        if not self._waiters:
            try:
                self.budget.take(self.reserve, reservation=True)
                return self.reserve
            except ServerBusy:
                pass
        left = context.time_remaining()
        wait = min(ROOM_WAIT_SECONDS, left if left is not None else ROOM_WAIT_SECONDS)
        turn: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(turn)
        self._grant()  # bytes given back by another thread since the take above are not missed
        try:
            async with asyncio.timeout(max(0.0, wait)):
                await turn
        except TimeoutError:
            if turn.done() and not turn.cancelled():  # granted as the wait ended: the room is this call's
                return self.reserve
            raise ServerBusy(self.reserve, self.budget.limit) from None
        except BaseException:  # the call was cancelled: a reservation granted meanwhile goes back
            if turn.done() and not turn.cancelled():
                self.budget.give(self.reserve, reservation=True)
            raise
        return self.reserve

    async def _read(self, context: aio.ServicerContext) -> bytes:
        """The call's one request message, within ``server.body_timeout_seconds``."""
        try:
            async with asyncio.timeout(self.body_timeout):
                data = await context.read()
        except TimeoutError:
            raise ClientError(
                f"the request message did not arrive within {self.body_timeout:g} s (server.body_timeout_seconds)",
                status=504,
                reason="body_timeout",
            ) from None
        if not isinstance(data, bytes):  # aio.EOF: the call ended without a message
            raise ClientError("ModelInfer takes one request message; none came", reason="malformed_message")
        return data

    async def model_infer(self, _requests: Any, context: aio.ServicerContext) -> Any:
        taken, reserved = 0, True
        refusal: HttpAnswer | None = None
        try:
            taken = await self._take_room(context)  # before a byte of the message is read
            data = await self._read(context)
            size = len(data)
            if size > self.limit:
                raise ClientError(
                    f"request message is {size} bytes; the limit is {self.limit} (server.max_body_bytes)",
                    status=413,
                    reason="too_large",
                )
            held = min(taken, 2 * size)  # the message, and its parsed copy
            self.budget.settle(taken, held)
            taken, reserved = held, False
            async with self.plane.place(size, True) as place:
                msg = await place.run(v2_grpc.parse_infer_request, data)
                del data
                request = await place.run(v2_grpc.decode_infer_request, msg, self.plane.max_elements)
                del msg
                response = await self.plane.infer(request, place)
                return await place.run(v2_grpc.encode_infer_response, response, request.used_binary)
        except Exception as exc:
            # the frames behind the error hold the request's buffers: let them go before answering, and keep
            # only the answer (the exception would keep this frame, and the buffers it names, until the
            # cyclic garbage collector runs: 32 MB per refused request of a burst)
            traceback.clear_frames(exc.__traceback__)
            refusal = answer_of(exc)
            # the call's abort keeps this frame (its exception's traceback) until the call is collected
            data = msg = request = None  # type: ignore[assignment]  # noqa: F841
        finally:
            self.budget.give(taken, reservation=reserved)
        assert refusal is not None
        await self._abort_with(context, refusal)

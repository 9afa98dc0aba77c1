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
receive limit is set to twice the bound, so no message over that is ever buffered (those are refused
by gRPC's transport with the same status, before the agent sees them, and are not counted).

The service is registered by hand (no generated ``_pb2_grpc`` module, which would import ``grpc`` too).
"""

from __future__ import annotations

import traceback
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
from agent.server.body_budget import BodyBudget
from agent.server.errors import answer_of
from agent.server.listeners import port_in_use_error
from exporters.prometheus import AgentMetrics

log = logs.get("grpc")

SERVICE = "inference.GRPCInferenceService"


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
    ) -> None:
        self.plane = plane
        self.budget = budget
        self.metrics = metrics
        self.ready = ready
        self.limit = max_body_bytes
        self.limit_concurrency = limit_concurrency
        self.server: aio.Server | None = None
        self.port: int | None = None
        self.address = ""

    def bind(self, host: str, port: int) -> None:
        """Make the server and bind its port (it answers nothing until :meth:`start`); a port in use is
        a :class:`~agent.server.listeners.PortUnavailable` naming it, before anything else starts."""
        limit = self.limit
        server = aio.server(
            options=[
                ("grpc.max_receive_message_length", 2 * limit),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
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
                # the serialised message: its size is checked before it is parsed (see the module docstring)
                "ModelInfer": unary(self.model_infer, None),
            },
        )

    async def _abort(self, context: aio.ServicerContext, exc: Exception) -> None:
        """End the call with the table's answer to ``exc`` (counted as HTTP counts it); raises."""
        answer = answer_of(exc)
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

    async def model_infer(self, data: bytes, context: aio.ServicerContext) -> Any:
        size = len(data)
        taken = 0
        failure: Exception | None = None
        try:
            if size > self.limit:
                raise ClientError(
                    f"request message is {size} bytes; the limit is {self.limit} (server.max_body_bytes)",
                    status=413,
                    reason="too_large",
                )
            self.budget.take(size)  # server.max_inflight_bytes, as HTTP bodies
            taken = size
            async with self.plane.place(size, True) as place:
                msg = await place.run(v2_grpc.parse_infer_request, data)
                del data
                request = await place.run(v2_grpc.decode_infer_request, msg, self.plane.max_elements)
                del msg
                response = await self.plane.infer(request, place)
                return await place.run(v2_grpc.encode_infer_response, response, request.used_binary)
        except Exception as exc:
            # the frames behind the error hold the request's buffers: let them go before answering
            traceback.clear_frames(exc.__traceback__)
            failure = exc
        finally:
            self.budget.give(taken)
        assert failure is not None
        await self._abort(context, failure)

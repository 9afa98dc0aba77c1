"""The dataplane: one typed path from an inference request to its answer, whichever transport brought
it (the HTTP fast path, the FastAPI route and the gRPC service decode their wire format into an
:class:`~agent.protocol.inference.InferRequest` and encode the :class:`InferResponse` back).

:meth:`DataPlane.infer` reads in four steps: the runtime the request addresses, the mode admits it
(validation) and predicts (the model, or the upstream), the recording policy judges it (verdicts when
asked; recorded with other requests' or, under commit durability, before the answer), and the mode
answers. Where each step runs is the request's :class:`~agent.dataplane.policy.Placement`.
"""

from __future__ import annotations

from typing import Any

from agent.dataplane.modes import Mode
from agent.dataplane.policy import Placement, Recording, ServingPolicy
from agent.dataplane.runtimes import RuntimeHolder
from agent.protocol.inference import InferRequest, InferResponse


class DataPlane:
    """Inference in the agent's mode (serve, proxy; observe refuses), judged and recorded."""

    def __init__(self, runtimes: RuntimeHolder, mode: Mode, policy: ServingPolicy) -> None:
        self.runtimes = runtimes
        self.mode = mode
        self.policy = policy
        self.recording: Recording = policy.recording

    @property
    def max_elements(self) -> int:
        """The bound on one request tensor's elements, checked by the decoders (``server.max_tensor_elements``)."""
        return self.runtimes.current.max_elements

    def place(self, size: int, binary: bool) -> Placement:
        """Where the stages of a request of ``size`` bytes run (the transport decodes and encodes there)."""
        return self.policy.place(size, binary)

    async def infer(self, request: InferRequest, place: Placement) -> InferResponse:
        rt = self.runtimes.resolve(request.model_name, request.model_version)
        admitted = await self.mode.admit(rt, request, place)
        predicted = await self.mode.predict(admitted, place)
        await self.recording.judge(predicted.work, admitted.wants_verdicts, place)
        return self.mode.answer(admitted, predicted)

    async def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The V2 model metadata of the model a request names (404 for another)."""
        return await self.mode.metadata(self.runtimes.resolve(name, version))

"""A V2 inference over HTTP: the body decoded into an :class:`~agent.protocol.inference.InferRequest`,
the dataplane's answer encoded back (JSON, or the binary tensor extension). The fast ASGI path and the
FastAPI route both answer inference with :func:`answer_http`."""

from __future__ import annotations

from agent.dataplane.plane import DataPlane
from agent.protocol import v2


async def answer_http(
    plane: DataPlane, body: bytes | bytearray, header_length: str | None, model: str, version: str | None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers answering an inference request for ``model`` (and ``version``); raises the
    errors the one error table answers."""
    async with plane.place(len(body), header_length is not None) as place:
        request = await place.run(
            v2.decode_request,
            body,
            header_length,
            max_elements=plane.max_elements,
            model_name=model,
            model_version=version,
        )
        response = await plane.infer(request, place)
        encoded: tuple[bytes, dict[str, str]] = await place.run(v2.encode_answer, response)
        return encoded

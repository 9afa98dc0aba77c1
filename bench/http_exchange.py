"""One request/response exchange of the benchmarks' load generators: a pre-encoded HTTP/1.1 request on
a keep-alive loopback connection, its response read to the end (``Content-Length`` bodies only)."""

from __future__ import annotations

import asyncio


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    """Send ``request``, read the whole response and return its status code."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status

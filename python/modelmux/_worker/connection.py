"""The worker's end of the socket: decodes frames as bytes arrive and coalesces the frames
written in one loop iteration into one transport write."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from modelmux._worker import protocol
from modelmux._worker.protocol import Frame

_FLUSH_AT = 256 * 1024
"""Buffered bytes above which `drain` writes at once instead of at the iteration's end."""


class Connection(asyncio.Protocol):
    """One protocol connection. `on_frame` gets each frame; `on_lost` runs when it closes."""

    def __init__(self, on_frame: Callable[[Frame], None], on_lost: Callable[[], None]) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._decoder = protocol.Decoder(protocol.INBOUND_TYPES)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._resumed: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except protocol.ProtocolError as e:
            print(f"modelmux worker: closing the connection: {e}", file=sys.stderr, flush=True)
            self.close()
            return
        for frame in frames:
            self._on_frame(frame)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_lost()

    def pause_writing(self) -> None:
        if self._resumed is None:
            self._resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    def write(
        self, type_: int, stream: int, head: dict[str, Any] | None = None, data: bytes = b""
    ) -> None:
        """Queues one frame; the loop iteration's frames go out in one write."""
        prefix = protocol.encode_prefix(type_, stream, protocol.encode_head(head), len(data))
        self._out.append(prefix)
        self._out_bytes += len(prefix)
        if data:
            self._out.append(data)
            self._out_bytes += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Writes the queued frames now."""
        self._flush_scheduled = False
        if not self._out or self._transport is None:
            return
        out = self._out
        self._out = []
        self._out_bytes = 0
        self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def drain(self) -> None:
        """Waits while the socket's buffer is full (a streaming body's flow control)."""
        if self._out_bytes >= _FLUSH_AT:
            self.flush()
        if self._resumed is not None:
            await asyncio.shield(self._resumed)

    def close(self) -> None:
        """Closes the socket (its loss then ends the worker)."""
        if self._transport is not None:
            self._transport.close()

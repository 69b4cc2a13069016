"""Handle calls on the wire (docs/python-worker-protocol.md), both ends.

The caller's end: a call's pickled arguments go out in one `CALL` frame or in chunks
(`CALL`, `CALL_BODY`..., `CALL_END`); its result comes back as one `CALL_RESULT`, or as a
`CALL_RESULT` with `more` followed by `CALL_RESULT_BODY` chunks and a `CALL_RESULT_END`.
`PendingCall` collects that answer; closing it before the end sends `CALL_CANCEL`, which
cancels the callee's request.

The callee's end of `stream=True`: `items` runs the method's generator; the worker sends each
item as a record (`modelmux._api.records`) as soon as it is made.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

from modelmux._api.exceptions import DeploymentUnavailableError
from modelmux._worker import protocol

MAX_CALL_ARGS = 512 * 1024 * 1024
"""The largest pickled arguments a handle call may send (the server refuses more)."""

class PendingCall:
    """The answer to one `CALL`, as it arrives."""

    def __init__(self, loop: asyncio.AbstractEventLoop, release: Callable[[bool], None]) -> None:
        """`release(cancel)` forgets the call, telling the server to cancel it if `cancel`."""
        self._head: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._wake = asyncio.Event()
        self._finished = False
        self._error: dict[str, Any] | None = None
        self._release = release
        self._closed = False

    # Frames from the server.

    def on_result(self, head: dict[str, Any], data: bytes) -> None:
        """`CALL_RESULT`."""
        if self._head.done():
            return
        self._head.set_result(head)
        if data:
            self._chunks.append(data)
        if not head.get("more"):
            self._finished = True
        self._wake.set()

    def on_body(self, data: bytes) -> None:
        """`CALL_RESULT_BODY`."""
        self._chunks.append(data)
        self._wake.set()

    def on_end(self, head: dict[str, Any]) -> None:
        """`CALL_RESULT_END`."""
        self._finished = True
        self._error = head.get("error")
        self._wake.set()

    # The caller's side.

    async def head(self) -> dict[str, Any]:
        """The `CALL_RESULT` head: `ok`, `status`, `exception` or `error`."""
        return await self._head

    async def chunks(self) -> AsyncIterator[bytes]:
        """The result's bytes as they arrive; raises if the answer was cut off."""
        while True:
            while self._chunks:
                yield self._chunks.popleft()
            if self._finished:
                break
            self._wake.clear()
            await self._wake.wait()
        if self._error is not None:
            raise DeploymentUnavailableError(
                str(self._error.get("type", "error")),
                str(self._error.get("message", "the answer was cut off")),
                self._error.get("status"),
            )

    async def read_all(self) -> bytes:
        """The whole result."""
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        """Done with it: before its end, the server is told to cancel the call."""
        if self._closed:
            return
        self._closed = True
        self._release(not self._finished)


def args_frames(
    head: dict[str, Any], payload: bytes
) -> list[tuple[int, dict[str, Any] | None, bytes]]:
    """The frames (type, head, data) that send a call's arguments, in order."""
    if len(payload) > MAX_CALL_ARGS:
        raise ValueError(
            f"a handle call's arguments are {len(payload)} bytes pickled, over the "
            f"{MAX_CALL_ARGS >> 20} MiB limit"
        )
    chunk = protocol.MAX_CHUNK
    if len(payload) <= chunk:
        return [(protocol.CALL, head, payload)]
    frames: list[tuple[int, dict[str, Any] | None, bytes]] = [
        (protocol.CALL, dict(head, more=True), payload[:chunk])
    ]
    view = memoryview(payload)
    for start in range(chunk, len(payload), chunk):
        frames.append((protocol.CALL_BODY, None, bytes(view[start : start + chunk])))
    frames.append((protocol.CALL_END, None, b""))
    return frames


async def items(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], what: str
) -> AsyncIterator[Any]:
    """The items of `fn(*args, **kwargs)` for `stream=True`: an async generator's are awaited,
    a plain generator's are taken one by one in the thread pool (in a copy of the current
    context), so a generator that blocks does not stop the worker."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        gen = fn(*args, **kwargs)  # runs none of its code yet
    elif inspect.iscoroutinefunction(fn):
        gen = await fn(*args, **kwargs)
    else:
        gen = await loop.run_in_executor(None, functools.partial(ctx.run, fn, *args, **kwargs))
    if hasattr(gen, "__aiter__"):
        async with contextlib.aclosing(gen):
            async for item in gen:
                yield item
        return
    if not hasattr(gen, "__next__"):
        raise TypeError(
            f"{what} was called with stream=True but returned {type(gen).__name__}, "
            "not a generator"
        )
    done = object()
    try:
        while True:
            item = await loop.run_in_executor(None, functools.partial(ctx.run, next, gen, done))
            if item is done:
                break
            yield item
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            close()

"""Driving ASGI apps from protocol frames: the scope from a `REQUEST` head, `receive()` from
the request's body frames, `send()` into `START`/`BODY`/`END` frames, the lifespan startup of
an ingress app, and the conversion of a plain `__call__`'s return value into a response."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import Response

from modelmux._worker import protocol
from modelmux._worker.connection import Connection

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def build_scope(head: dict[str, Any], state: dict[str, Any] | None) -> dict[str, Any]:
    """The ASGI HTTP scope of a `REQUEST` head (`state`: the lifespan's, copied per request)."""
    path: str = head["path"]
    client = head.get("client")
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": head.get("http_version") or "1.1",
        "method": head["method"],
        "scheme": head.get("scheme") or "http",
        "path": path,
        # The path as the client sent it; re-encoded from `path` when the head has none.
        "raw_path": (head.get("raw_path") or urllib.parse.quote(path, safe=_PATH_SAFE)).encode(
            "latin-1"
        ),
        "query_string": (head.get("query_string") or "").encode("utf-8"),
        "root_path": head.get("root_path") or "",
        "headers": [
            (name.encode("latin-1"), value.encode("latin-1")) for name, value in head["headers"]
        ],
        "client": (client[0], client[1]) if client else None,
        "server": None,
    }
    if state is not None:
        scope["state"] = dict(state)
    return scope


class RequestBody:
    """A request's body as it arrives; `receive()` gives ASGI's `http.request` messages, then
    `http.disconnect` once the client is gone."""

    def __init__(self, first: bytes, more: bool) -> None:
        self._chunks: deque[bytes] = deque([first] if first else [])
        self._complete = not more
        self._final_sent = False
        self._disconnected = False
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def feed(self, chunk: bytes) -> None:
        """A `REQUEST_BODY` chunk."""
        if chunk and not self._complete:
            self._chunks.append(chunk)
            self._wake()

    def finish(self) -> None:
        """`REQUEST_END`: the body is complete."""
        self._complete = True
        self._wake()

    def disconnect(self) -> None:
        """`CANCEL`: the client is gone."""
        self._disconnected = True
        self._wake()

    async def receive(self) -> Message:
        """ASGI `receive`."""
        while True:
            if self._disconnected:
                return {"type": "http.disconnect"}
            if self._chunks:
                chunks = self._chunks
                body = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._final_sent = self._complete
                return {"type": "http.request", "body": body, "more_body": not self._complete}
            if self._complete and not self._final_sent:
                self._final_sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read_all(self) -> bytes:
        """The whole body (raises ConnectionError if the client goes first)."""
        parts = []
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("the client disconnected before the body was complete")
            parts.append(message["body"])
            if not message["more_body"]:
                return b"".join(parts)


class ResponseSender:
    """ASGI `send` for one request: `http.response.start` waits to go out with the first body
    message as one `START` frame; later body messages are `BODY` frames, the last an `END`."""

    def __init__(self, conn: Connection, stream: int) -> None:
        self._conn = conn
        self._stream = stream
        self._start: tuple[int, list[list[str]]] | None = None
        self.started = False
        self.complete = False
        self.closed = False
        # Bytes this response may still send before modelmux credits more (`CREDIT`).
        self._credit = protocol.RESPONSE_WINDOW
        self._credited = asyncio.Event()

    def add_credit(self, n: int) -> None:
        """modelmux's reader took `n` more bytes of this response."""
        self._credit += n
        self._credited.set()

    def close(self) -> None:
        """The request was cancelled: nothing more is sent, and a send waiting for credit
        goes on (to find the sender closed)."""
        self.closed = True
        self._credited.set()

    async def _room(self, n: int) -> None:
        """Waits until the window has room, then takes `n` bytes of it (a slow reader of this
        response makes this response wait, not the connection)."""
        while self._credit <= 0 and not self.closed:
            self._credited.clear()
            await self._credited.wait()
        self._credit -= max(n, 1)

    async def send(self, message: Message) -> None:
        """ASGI `send`."""
        if self.closed:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self._start is not None or self.started:
                raise RuntimeError("ASGI: http.response.start sent twice")
            headers = [
                [bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1")]
                for k, v in message.get("headers", ())
            ]
            self._start = (int(message["status"]), headers)
        elif kind == "http.response.body":
            if self._start is None:
                raise RuntimeError("ASGI: http.response.body before http.response.start")
            if self.complete:
                raise RuntimeError("ASGI: http.response.body after the response was complete")
            more = bool(message.get("more_body", False))
            body = bytes(message.get("body", b""))
            if more:
                await self._room(len(body))
                if self.closed:
                    return
            self.write(body, more)
            if more:
                await self._conn.drain()
        else:
            raise RuntimeError(f"ASGI: unsupported message type {kind!r}")

    def respond(self, status: int, headers: list[list[str]], body: bytes) -> None:
        """A whole response at once."""
        self._start = (status, headers)
        self.write(body, False)

    def write(self, body: bytes, more: bool) -> None:
        """Sends body bytes (the first ones with the start); `more=False` ends the response."""
        chunk = protocol.MAX_CHUNK
        if not self.started:
            assert self._start is not None
            status, headers = self._start
            first, body = body[:chunk], body[chunk:]
            self.started = True
            end_now = not more and not body
            head = {"status": status, "headers": headers, "more": not end_now}
            self._conn.write(protocol.START, self._stream, head, first)
            if end_now:
                self.complete = True
                return
        for i in range(0, len(body), chunk):
            self._conn.write(protocol.BODY, self._stream, None, body[i : i + chunk])
        if not more:
            self._conn.write(protocol.END, self._stream)
            self.complete = True


def _json_default(obj: Any) -> Any:
    tolist = getattr(obj, "tolist", None)  # numpy arrays and scalars
    if callable(tolist):
        return tolist()
    model_dump = getattr(obj, "model_dump", None)  # pydantic models
    if callable(model_dump):
        return model_dump()
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def render(result: Any) -> tuple[bytes, str]:
    """The body and content type of a plain `__call__`'s return value: `str` as text, `bytes`
    as octet-stream, anything else as JSON (`None` is `null`)."""
    if isinstance(result, str):
        return result.encode("utf-8"), "text/plain; charset=utf-8"
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result), "application/octet-stream"
    return json.dumps(result, default=_json_default).encode("utf-8"), "application/json"


async def send_result(
    result: Any, scope: dict[str, Any], receive: Receive, sender: ResponseSender
) -> None:
    """Answers the request with a `__call__`'s return value."""
    if isinstance(result, Response):
        await result(scope, receive, sender.send)
        return
    body, content_type = render(result)
    sender.respond(
        200, [["content-type", content_type], ["content-length", str(len(body))]], body
    )


class _LifespanUnsupported(Exception):
    pass


async def start_lifespan(app: Callable[..., Awaitable[None]]) -> dict[str, Any] | None:
    """Runs the ASGI app's lifespan startup; returns its state, or None when the app does
    not speak the lifespan protocol. Raises RuntimeError when its startup fails.

    The app's lifespan task keeps running (holding its context) for the worker's life.
    """
    loop = asyncio.get_running_loop()
    started: asyncio.Future[None] = loop.create_future()
    state: dict[str, Any] = {}
    asked = False

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "lifespan.startup"}
        await loop.create_future()  # no shutdown: the worker exits when its socket closes
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if started.done():
            return
        if message["type"] == "lifespan.startup.complete":
            started.set_result(None)
        elif message["type"] == "lifespan.startup.failed":
            started.set_exception(
                RuntimeError(f"the ASGI app's startup failed: {message.get('message', '')}")
            )

    async def run() -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": state}
        try:
            await app(scope, receive, send)
        except Exception as e:
            if not started.done():
                started.set_exception(_LifespanUnsupported(e))
            else:
                raise
        if not started.done():
            started.set_exception(_LifespanUnsupported())

    task = loop.create_task(run())
    try:
        await started
    except _LifespanUnsupported:
        return None
    _lifespans.add(task)
    return state


_lifespans: set[asyncio.Task[None]] = set()

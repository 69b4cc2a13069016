"""`DeploymentHandle`, `DeploymentResponse` and `DeploymentResponseGenerator`: calling a
deployment's methods.

Inside a replica a call is a `CALL` frame to the server, which routes it like a request; in
a driver (after `serve.run`) it is an HTTP POST to the server's handle-call endpoint. Either
way the arguments travel pickled and the result (or the callee's exception) comes back so.
With `options(stream=True)` the callee's generator's items come back one by one, as made
(inside replicas).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Generator
from typing import Any

import cloudpickle

from modelmux._api import client, context, records, serialization
from modelmux._api.exceptions import (
    DeploymentUnavailableError,
    RayServeException,
    RequestCancelledError,
)

_UNSET: Any = object()


def _decode(status: int, exception: bool, body: bytes, what: str) -> Any:
    """The value of a call's answer, or raises the callee's exception or the error."""
    if exception:
        try:
            exc = serialization.loads(body)
        except Exception as e:
            raise RayServeException(
                f"{what} raised an exception that does not unpickle: {e}"
            ) from e
        raise exc
    if status == 200:
        return serialization.loads(body)
    error_type, message = client.error_message(client.HttpResult(status, {}, body))
    raise DeploymentUnavailableError(error_type, message, status)


class DeploymentResponse:
    """The pending result of `handle.remote(...)`: `await` it, or `.result()` in sync code."""

    def __init__(self, future: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
        self._future = future

    def __reduce__(self) -> Any:
        # Only a top-level argument of a handle call is awaited and its value passed on; one
        # inside a list or dict would be pickled, and a pending call cannot be.
        raise RayServeException(
            "`DeploymentResponse` is not serializable: pass it as an argument of its own "
            "(the call awaits it and passes its value on), or await it first"
        )

    def __await__(self) -> Generator[Any, None, Any]:
        future = self._future
        if isinstance(future, concurrent.futures.Future):
            return asyncio.wrap_future(future).__await__()
        return future.__await__()

    def result(self, timeout_s: float | None = None) -> Any:
        """Waits for the result (at most `timeout_s`; TimeoutError after that).

        Not on an event loop's thread (that would block the loop): use `await` there.
        """
        _refuse_on_a_loop("DeploymentResponse.result()", "`await response`")
        future = self._future
        if isinstance(future, asyncio.Future):
            future = asyncio.run_coroutine_threadsafe(_wait(future), future.get_loop())
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the call did not finish within {timeout_s} s") from None


def _refuse_on_a_loop(what: str, instead: str) -> None:
    """Raises if this thread runs an event loop: `what` would block it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{what} blocks, and this thread runs an event loop: use {instead} instead")


async def _wait(future: asyncio.Future[Any]) -> Any:
    return await future


class DeploymentResponseGenerator:
    """The items of a `stream=True` call, as the callee makes them: `async for` inside a
    deployment, `for` in a thread that runs no event loop. `cancel()` (or leaving the loop
    and dropping it) cancels the callee's generator."""

    def __init__(self, loop: asyncio.AbstractEventLoop, items: AsyncIterator[Any]) -> None:
        self._loop = loop
        self._items = items
        self._cancelled = False

    def __aiter__(self) -> DeploymentResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        if self._cancelled:
            raise RequestCancelledError("the call was cancelled")
        return await self._items.__anext__()

    def __iter__(self) -> DeploymentResponseGenerator:
        return self

    def __next__(self) -> Any:
        _refuse_on_a_loop("iterating a DeploymentResponseGenerator with `for`", "`async for`")
        if self._cancelled:
            raise RequestCancelledError("the call was cancelled")
        future = asyncio.run_coroutine_threadsafe(_next(self._items), self._loop)
        try:
            return future.result()
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self) -> None:
        """Stops the call: the callee's generator is cancelled, and asking for another item
        raises `RequestCancelledError` (as in Ray)."""
        self._cancelled = True
        aclose = getattr(self._items, "aclose", None)
        if aclose is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._loop.create_task(aclose())
        else:
            asyncio.run_coroutine_threadsafe(aclose(), self._loop)


async def _next(items: AsyncIterator[Any]) -> Any:
    return await items.__anext__()


class DeploymentHandle:
    """A handle to a deployment: `handle.remote(...)` calls `__call__`,
    `handle.<method>.remote(...)` another method, `handle.options(...)` sets the model id."""

    def __init__(
        self,
        deployment_name: str,
        app_name: str | None = None,
        *,
        method_name: str = "__call__",
        multiplexed_model_id: str | None = None,
        stream: bool = False,
    ) -> None:
        self._deployment = deployment_name
        self._app = app_name
        self._method = method_name
        self._model_id = multiplexed_model_id
        self._stream = stream

    @property
    def deployment_name(self) -> str:
        """The deployment's name."""
        return self._deployment

    @property
    def app_name(self) -> str | None:
        """Its application (None: the caller's own, inside a replica)."""
        return self._app

    def options(
        self,
        *,
        method_name: str = _UNSET,
        multiplexed_model_id: str = _UNSET,
        stream: bool = _UNSET,
        **unknown: Any,
    ) -> DeploymentHandle:
        """A copy calling `method_name`, for the model `multiplexed_model_id`, and/or with
        `stream=True` (the method is a generator: `remote()` returns a
        `DeploymentResponseGenerator` yielding its items as they are made).

        The model id is not inherited from the request being served: a call carries one only
        when it is set here.
        """
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            raise TypeError(f"DeploymentHandle.options() got unsupported option(s) {names}")
        if stream is not _UNSET and not isinstance(stream, bool):
            raise TypeError("stream must be a bool")
        if multiplexed_model_id is not _UNSET and not isinstance(multiplexed_model_id, str):
            raise TypeError("multiplexed_model_id must be a str")
        return DeploymentHandle(
            self._deployment,
            self._app,
            method_name=self._method if method_name is _UNSET else method_name,
            multiplexed_model_id=(
                self._model_id if multiplexed_model_id is _UNSET else multiplexed_model_id or None
            ),
            stream=self._stream if stream is _UNSET else stream,
        )

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.options(method_name=name)

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse | DeploymentResponseGenerator:
        """Starts the call; returns its `DeploymentResponse` (with `stream=True`, its
        `DeploymentResponseGenerator`).

        A `DeploymentResponse` among the positional or keyword arguments is awaited first and
        its value passed on.
        """
        rt = context.runtime()
        if self._stream:
            if rt is None:
                raise TypeError(
                    "stream=True handle calls are made inside deployments; from a driver, "
                    "call a method that returns a list"
                )
            return DeploymentResponseGenerator(rt.loop, self._stream_items(rt, args, kwargs))
        if rt is None:
            return DeploymentResponse(client.submit(self._call_server, args, kwargs))
        coro = self._call_worker(rt, args, kwargs)
        try:
            on_loop = asyncio.get_running_loop() is rt.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            return DeploymentResponse(rt.loop.create_task(coro))
        return DeploymentResponse(asyncio.run_coroutine_threadsafe(coro, rt.loop))

    def _what(self) -> str:
        return f"{self._deployment}.{self._method}"

    async def _start(
        self, rt: context.WorkerRuntime, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[context.CallAnswer, dict[str, Any]]:
        """Sends the call; returns its answer and the answer's head, once delivered."""
        args = tuple([await a if isinstance(a, DeploymentResponse) else a for a in args])
        kwargs = {
            k: await v if isinstance(v, DeploymentResponse) else v for k, v in kwargs.items()
        }
        payload = serialization.dumps((args, kwargs))
        answer = await rt.call(
            self._deployment, self._app, self._method, self._model_id, payload, self._stream
        )
        try:
            head = await answer.head()
        except BaseException:
            answer.close()
            raise
        if not head.get("ok"):
            answer.close()
            error = head.get("error") or {}
            raise DeploymentUnavailableError(
                str(error.get("type", "error")),
                str(error.get("message", "the call could not be delivered")),
                error.get("status"),
            )
        return answer, head

    async def _call_worker(
        self, rt: context.WorkerRuntime, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        answer, head = await self._start(rt, args, kwargs)
        try:
            data = await answer.read_all()
        finally:
            answer.close()
        return _decode(
            int(head.get("status", 200)), bool(head.get("exception")), data, self._what()
        )

    async def _stream_items(
        self, rt: context.WorkerRuntime, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncIterator[Any]:
        answer, head = await self._start(rt, args, kwargs)
        try:
            status = int(head.get("status", 200))
            if head.get("exception") or status != 200:
                _decode(status, bool(head.get("exception")), await answer.read_all(), self._what())
            parser = records.Records()
            async for chunk in answer.chunks():
                for tag, payload in parser.feed(chunk):
                    if tag == records.EXCEPTION:
                        _decode(200, True, payload, self._what())
                    yield serialization.loads(payload)
            if parser.partial:
                raise RayServeException(f"the stream of {self._what()} was cut off mid-item")
        finally:
            answer.close()

    def _call_server(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        args = tuple(a.result() if isinstance(a, DeploymentResponse) else a for a in args)
        kwargs = {
            k: v.result() if isinstance(v, DeploymentResponse) else v for k, v in kwargs.items()
        }
        headers = {"content-type": "application/x-python-pickle"}
        if self._model_id:
            headers["serve_multiplexed_model_id"] = self._model_id
        app = self._app if self._app is not None else "default"
        result = client.request(
            "POST",
            client.call_path(self._deployment, self._method, app),
            body=cloudpickle.dumps((args, kwargs)),
            headers=headers,
        )
        exception = result.headers.get("x-modelmux-result") == "exception"
        return _decode(result.status, exception and result.status == 500, result.body, self._what())

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (self._deployment, self._app, self._method, self._model_id, self._stream),
        )

    def __repr__(self) -> str:
        model = f", multiplexed_model_id={self._model_id!r}" if self._model_id else ""
        stream = ", stream=True" if self._stream else ""
        return (
            f"DeploymentHandle(deployment={self._deployment!r}, app={self._app!r}, "
            f"method={self._method!r}{model}{stream})"
        )


def _rebuild(
    deployment: str, app: str | None, method: str, model_id: str | None, stream: bool = False
) -> DeploymentHandle:
    return DeploymentHandle(
        deployment, app, method_name=method, multiplexed_model_id=model_id, stream=stream
    )

"""The worker: one replica's instance and model table, serving the frames of its socket.

Each `REQUEST` runs as its own task (`CANCEL` cancels it); each `CONTROL` too. Handle calls
and model acquisitions are streams the worker opens, answered by `CALL_RESULT` (a call's
frames, both ways, are in `calls.py`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import os
import socket
import sys
import types
from collections.abc import Callable
from typing import Any, NoReturn

from starlette.requests import Request

from modelmux._api import context, records, serialization
from modelmux._api.deployment import Application
from modelmux._api.exceptions import ModelLoadError, NoSuchMethodError
from modelmux._api.graph import deployments_of, replace_bound
from modelmux._api.handle import DeploymentHandle
from modelmux._api.ingress import ingress_app
from modelmux._api.multiplex import find_multiplexed
from modelmux._worker import app_loader, asgi, calls, errors, protocol
from modelmux._worker.connection import Connection
from modelmux._worker.protocol import Frame

# How long an unload waits for the work a model's `__del__` started (handle calls).
UNLOAD_WORK_TIMEOUT_S = 10.0


async def call_user(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls user code: a coroutine function is awaited; a plain one runs in the default thread
    pool (in a copy of the current context, so the request's model id goes with it)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    ctx = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(None, functools.partial(ctx.run, fn, *args, **kwargs))
    if inspect.isawaitable(result):
        result = await result
    return result


def _takes_argument(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(p.kind in positional for p in params)


def _disarm_del(obj: Any) -> None:
    """Makes the collector's `__del__` of `obj` (whose `async def __del__` ran) a no-op."""
    cls = type(obj)
    try:
        obj.__class__ = type(cls.__name__, (cls,), {"__del__": lambda self: None})
    except TypeError:  # a class whose instances cannot change class: leave it
        pass


def _exit(status: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class _Request:
    __slots__ = ("body", "sender", "task")

    def __init__(self, body: asgi.RequestBody, sender: asgi.ResponseSender) -> None:
        self.body = body
        self.sender = sender
        self.task: asyncio.Task[None] | None = None


class Worker:
    """The replica's runtime (`context.WorkerRuntime`) and the protocol's dispatcher."""

    def __init__(self, spec: dict[str, Any], root: Application, app: Application) -> None:
        self.loop = asyncio.get_running_loop()
        self.app_name: str = spec.get("app_name") or "default"
        self.instance: Any = None
        # The module-level function the deployment multiplexes with (None for a method).
        self.multiplexed_func: Any = None
        self.models: dict[str, Any] = {}
        self._spec = spec
        self._root = root
        self._app = app
        self._conn: Connection | None = None
        self._ready: asyncio.Future[None] = self.loop.create_future()
        self._requests: dict[int, _Request] = {}
        self._controls: set[asyncio.Task[None]] = set()
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._calls: dict[int, calls.PendingCall] = {}
        self._next_stream = 1
        self._loader: Callable[[str], Any] | None = None
        self._size_bytes: Callable[[Any], int] | None = None
        self._ingress: Any = None
        self._lifespan_state: dict[str, Any] | None = None
        self._call_takes_request = True

    # Start.

    async def build(self) -> None:
        """Constructs the instance (bound deployments among its arguments become handles),
        applies `user_config`, and starts an ingress app's lifespan."""
        # type[object], not type[Any]: mypy resolves `__new__` of type[Any] as type.__new__.
        cls: type[object] = self._app.deployment.func_or_class
        context.set_runtime(self)

        def handle(bound: Application) -> DeploymentHandle:
            return DeploymentHandle(bound.name)

        args = replace_bound(self._app.args, handle)
        kwargs = replace_bound(self._app.kwargs, handle)
        init = getattr(cls, "__init__", None)
        if inspect.iscoroutinefunction(init):
            # An `async def __init__`, which Ray awaits: the instance is made, then awaited into.
            instance = cls.__new__(cls)
            await init(instance, *args, **kwargs)
            self.instance = instance
        else:
            self.instance = cls(*args, **kwargs)
        context.get_replica_context().servable_object = self.instance
        multiplexed = find_multiplexed(cls)
        if multiplexed is not None:
            config = multiplexed[1]
            if config.method:
                self._loader = types.MethodType(config.func, self.instance)
            else:
                # A plain function the class calls: its calls in this replica use the table.
                self.multiplexed_func = config.func
                self._loader = config.func
            self._size_bytes = config.size_bytes
        user_config = self._spec.get("user_config")
        if user_config is not None and callable(getattr(self.instance, "reconfigure", None)):
            await call_user(self.instance.reconfigure, user_config)
        self._ingress = ingress_app(cls)
        if self._ingress is not None:
            self._lifespan_state = await asgi.start_lifespan(self._ingress)
        http_call = self.instance.__call__ if callable(self.instance) else None
        if http_call is not None:
            self._call_takes_request = _takes_argument(http_call)

    async def serve(self, path: str) -> NoReturn:
        """Connects, sends `READY`, and serves until the socket closes (then exits 0)."""
        try:
            _, conn = await self.loop.create_unix_connection(
                lambda: Connection(self._on_frame, lambda: _exit(0)), path
            )
        except OSError as e:
            print(f"modelmux worker: cannot connect to {path}: {e}", file=sys.stderr)
            _exit(1)
        self._conn = conn
        head = {"pid": os.getpid(), "multiplexed": self._loader is not None}
        conn.write(protocol.READY, 0, head)
        self._ready.set_result(None)
        await self.loop.create_future()
        raise AssertionError("unreachable")

    def ingress_name(self) -> str:
        """The application's ingress deployment."""
        return self._root.name

    # Frames from Rust.

    def _on_frame(self, frame: Frame) -> None:
        kind = frame.type
        if kind == protocol.REQUEST:
            head = frame.head or {}
            assert self._conn is not None
            req = _Request(
                asgi.RequestBody(frame.data, bool(head.get("more"))),
                asgi.ResponseSender(self._conn, frame.stream),
            )
            self._requests[frame.stream] = req
            req.task = self.loop.create_task(self._serve_request(frame.stream, head, req))
        elif kind == protocol.REQUEST_BODY:
            if (known := self._requests.get(frame.stream)) is not None:
                known.body.feed(frame.data)
        elif kind == protocol.REQUEST_END:
            if (known := self._requests.get(frame.stream)) is not None:
                known.body.finish()
        elif kind == protocol.CREDIT:
            if (known := self._requests.get(frame.stream)) is not None:
                known.sender.add_credit(int.from_bytes(frame.data, "big"))
        elif kind == protocol.CANCEL:
            if (known := self._requests.pop(frame.stream, None)) is not None:
                known.sender.close()
                known.body.disconnect()
                if known.task is not None:
                    known.task.cancel()
        elif kind == protocol.CONTROL:
            task = self.loop.create_task(self._control(frame.stream, frame.head or {}))
            self._controls.add(task)
            task.add_done_callback(self._controls.discard)
        elif kind == protocol.CALL_RESULT:
            if (call := self._calls.get(frame.stream)) is not None:
                call.on_result(frame.head or {}, frame.data)
            elif (future := self._pending.get(frame.stream)) is not None and not future.done():
                future.set_result((frame.head or {}, frame.data))
        elif kind == protocol.CALL_RESULT_BODY:
            if (call := self._calls.get(frame.stream)) is not None:
                call.on_body(frame.data)
        elif kind == protocol.CALL_RESULT_END:
            if (call := self._calls.get(frame.stream)) is not None:
                call.on_end(frame.head or {})

    # Requests.

    async def _serve_request(self, stream: int, head: dict[str, Any], req: _Request) -> None:
        context.set_request_stream(stream, head.get("model_id") or "")
        context.set_model_id(head.get("model_id") or "")
        sender = req.sender
        try:
            method = head.get("call")
            if method is not None:
                await self._serve_call(method, req.body, sender, bool(head.get("stream")))
            else:
                await self._serve_http(head, req.body, sender)
            if not sender.complete and not sender.closed:
                raise RuntimeError("the application returned without completing its response")
        except asyncio.CancelledError:
            pass
        except Exception as e:
            error = errors.describe(e)
            sys.stderr.write(error["traceback"])
            if not sender.complete and not sender.closed:
                assert self._conn is not None
                self._conn.write(protocol.ERROR, stream, error)
        finally:
            self._requests.pop(stream, None)

    async def _serve_http(
        self, head: dict[str, Any], body: asgi.RequestBody, sender: asgi.ResponseSender
    ) -> None:
        scope = asgi.build_scope(head, self._lifespan_state)
        if self._ingress is not None:
            await self._ingress(scope, body.receive, sender.send)
            return
        http_call = self.instance.__call__ if callable(self.instance) else None
        if http_call is None:
            raise TypeError(
                f"deployment {self._app.name} has no __call__ method and no @serve.ingress app"
            )
        args = (Request(scope, body.receive),) if self._call_takes_request else ()
        result = await call_user(http_call, *args)
        await asgi.send_result(result, scope, body.receive, sender)

    def _method(self, name: str) -> Callable[..., Any]:
        """The instance's method `name`, which a handle call names; RayServeException, listing
        the methods there are, when it has none (as Ray answers)."""
        fn: object = getattr(self.instance, name, None)
        if callable(fn) and (name == "__call__" or not name.startswith("_")):
            return fn
        methods = sorted(
            n
            for n in dir(self.instance)
            if (n == "__call__" or not n.startswith("_"))
            and callable(getattr(self.instance, n, None))
        )
        raise NoSuchMethodError(
            f"deployment '{self._app.name}' has no method '{name}' to call. "
            f"Available methods: {methods}"
        )

    async def _serve_call(
        self, method: str, body: asgi.RequestBody, sender: asgi.ResponseSender, streamed: bool
    ) -> None:
        data = await body.read_all()
        if streamed:
            await self._serve_stream(method, data, sender)
            return
        try:
            args, kwargs = serialization.loads(data)
            value = await call_user(self._method(method), *args, **kwargs)
            if inspect.isgenerator(value) or inspect.isasyncgen(value):
                raise TypeError(
                    f"{self._app.name}.{method} returned a generator: call it through "
                    "handle.options(stream=True) to get its items"
                )
            status, kind, payload = 200, "value", serialization.dumps(value)
        except Exception as e:
            sys.stderr.write(errors.describe(e)["traceback"])
            status, kind, payload = 500, "exception", serialization.dumps_exception(e)
        headers = [["content-type", "application/x-python-pickle"], ["x-modelmux-result", kind]]
        sender.respond(status, headers, payload)

    async def _serve_stream(self, method: str, data: bytes, sender: asgi.ResponseSender) -> None:
        """A `stream=True` call: each item goes out as a record as soon as it is made; an
        exception ends the stream with an exception record."""
        headers = [
            (b"content-type", b"application/x-modelmux-pickle-stream"),
            (b"x-modelmux-result", b"stream"),
        ]
        await sender.send({"type": "http.response.start", "status": 200, "headers": headers})

        async def emit(tag: bytes, payload: bytes) -> None:
            message = {"type": "http.response.body", "body": records.record(tag, payload)}
            await sender.send(dict(message, more_body=True))

        try:
            args, kwargs = serialization.loads(data)
            fn = self._method(method)
            what = f"{self._app.name}.{method}"
            async for item in calls.items(fn, args, kwargs, what):
                await emit(records.VALUE, serialization.dumps(item))
        except Exception as e:
            sys.stderr.write(errors.describe(e)["traceback"])
            await emit(records.EXCEPTION, serialization.dumps_exception(e))
        await sender.send({"type": "http.response.body", "body": b"", "more_body": False})

    # Controls.

    async def _control(self, stream: int, head: dict[str, Any]) -> None:
        op = head.get("op")
        try:
            if op == "load":
                reply = await self._load(head.get("model_id"))
            elif op == "unload":
                await self._unload(head.get("model_id"))
                reply = {"ok": True}
            elif op == "health":
                check = getattr(self.instance, "check_health", None)
                if check is not None:
                    await call_user(check)
                reply = {"ok": True}
            elif op == "reconfigure":
                reconfigure = getattr(self.instance, "reconfigure", None)
                if reconfigure is None:
                    raise AttributeError(f"deployment {self._app.name} has no reconfigure method")
                await call_user(reconfigure, head.get("user_config"))
                reply = {"ok": True}
            else:
                raise ValueError(f"unknown control op {op!r}")
        except Exception as e:
            error = errors.describe(e)
            sys.stderr.write(error["traceback"])
            reply = {"ok": False, "error": error}
        assert self._conn is not None
        self._conn.write(protocol.REPLY, stream, reply)

    async def _unload(self, model_id: Any) -> None:
        """Drops the model (its `__del__` runs, if nothing else holds it) and waits, up to
        `UNLOAD_WORK_TIMEOUT_S`, for what that started on this loop: a handle call made from
        `__del__` (recording that the model is gone, as Ray's own test does) reaches its
        deployment before the server hears that the model is unloaded, and so before a
        replica that is shutting down is stopped."""
        before = asyncio.all_tasks(self.loop)
        model = self.models.pop(model_id, None)
        release = getattr(type(model), "__del__", None)
        if release is None or not inspect.iscoroutinefunction(release):
            # A plain `__del__` runs when the last reference goes (here, unless the user's
            # code holds one): what it started, it started just now, before any other task
            # could run and start something of its own.
            del model
            started = asyncio.all_tasks(self.loop) - before
            if started:
                await asyncio.wait(started, timeout=UNLOAD_WORK_TIMEOUT_S)
            return
        # An `async def __del__` is awaited here, as Ray's multiplexer does (Python's own
        # call would make a coroutine nobody runs); the class is then swapped for one whose
        # `__del__` does nothing, for the collector's call.
        try:
            await asyncio.wait_for(release(model), UNLOAD_WORK_TIMEOUT_S)
        except Exception as e:
            sys.stderr.write(errors.describe(e)["traceback"])
        _disarm_del(model)

    async def _load(self, model_id: Any) -> dict[str, Any]:
        if not isinstance(model_id, str) or not model_id:
            raise ValueError(f"a load needs a non-empty model_id, got {model_id!r}")
        if self._loader is None:
            raise TypeError(f"deployment {self._app.name} has no @serve.multiplexed method")
        if model_id not in self.models:
            context.set_model_id(model_id)
            model = await call_user(self._loader, model_id)
            size = self._size(model)
            self.models[model_id] = model
        else:
            size = self._size(self.models[model_id])
        return {"ok": True, "size_bytes": size}

    def _size(self, model: Any) -> int | None:
        if self._size_bytes is None:
            return None
        size = self._size_bytes(model)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise TypeError(f"size_bytes must return an int >= 0, it returned {size!r}")
        return size

    # Streams the worker opens.

    def _stream_id(self) -> int:
        stream = self._next_stream
        self._next_stream = stream + 1 if stream < 0xFFFFFFFF else 1
        return stream

    async def _exchange(
        self, kind: int, head: dict[str, Any], data: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        if not self._ready.done():
            await self._ready
        assert self._conn is not None
        stream = self._stream_id()
        future: asyncio.Future[tuple[dict[str, Any], bytes]] = self.loop.create_future()
        self._pending[stream] = future
        try:
            self._conn.write(kind, stream, head, data)
            return await future
        finally:
            self._pending.pop(stream, None)

    async def call(
        self,
        deployment: str,
        app: str | None,
        method: str,
        model_id: str | None,
        payload: bytes,
        stream: bool = False,
    ) -> calls.PendingCall:
        """Sends a handle call (`CALL`, its arguments chunked when large); returns its answer as
        it arrives. The caller must `close()` it."""
        head: dict[str, Any] = {
            "deployment": deployment,
            "app": app,
            "method": method,
            "model_id": model_id,
        }
        if stream:
            head["stream"] = True
        frames = calls.args_frames(head, payload)
        if not self._ready.done():
            await self._ready
        conn = self._conn
        assert conn is not None
        id_ = self._stream_id()

        def release(cancel: bool) -> None:
            if self._calls.pop(id_, None) is not None and cancel:
                conn.write(protocol.CALL_CANCEL, id_)

        pending = calls.PendingCall(self.loop, release)
        self._calls[id_] = pending
        try:
            for kind, frame_head, data in frames:
                conn.write(kind, id_, frame_head, data)
                await conn.drain()
        except BaseException:
            pending.close()
            raise
        return pending

    async def acquire(self, model_id: str, stream: int) -> Any:
        """Asks the server for a model the request on `stream` needs (`ACQUIRE`)."""
        head, _ = await self._exchange(protocol.ACQUIRE, {"model_id": model_id, "request": stream})
        if not head.get("ok"):
            error = head.get("error") or {}
            raise ModelLoadError(
                model_id, str(error.get("type", "error")), str(error.get("message", ""))
            )
        try:
            return self.models[model_id]
        except KeyError:
            raise RuntimeError(
                f"the server acquired model '{model_id}' for this request, "
                "but this replica does not hold it"
            ) from None


def _fatal(path: str | None, exc: BaseException, origin: tuple[str, int] | None) -> NoReturn:
    """Reports a start failure: `FATAL` on the socket (if it connects), the traceback on
    stderr, exit status 1."""
    error = errors.describe(exc)
    sys.stderr.write(error["traceback"])
    if path:
        head = {
            "type": error["type"],
            "message": error["message"],
            "where": errors.location(exc, origin),
            "traceback": error["traceback"],
        }
        frame = protocol.encode(protocol.FATAL, 0, head)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(path)
                sock.sendall(frame)
        except OSError as e:
            print(f"modelmux worker: cannot report the failure on {path}: {e}", file=sys.stderr)
    _exit(1)


async def _main(spec: dict[str, Any]) -> NoReturn:
    loaded = None
    try:
        app_loader.prepare(spec.get("working_dir"))
        deployment = spec["deployment"]
        context.set_replica_context(
            context.ReplicaContext(
                app_name=spec.get("app_name") or "default",
                deployment=deployment,
                replica_id=context.ReplicaID(spec.get("replica_id") or deployment),
            )
        )
        loaded = app_loader.load_application(spec["app_source"])
        root = loaded.app
        graph = deployments_of(root)
        if deployment not in graph:
            raise ValueError(
                f"the application has no deployment named '{deployment}' "
                f"(it has {', '.join(graph)})"
            )
        worker = Worker(spec, root, graph[deployment])
        await worker.build()
    except Exception as e:
        _fatal(spec.get("socket"), e, loaded.origin if loaded else None)
    await worker.serve(spec["socket"])


def run(spec: dict[str, Any]) -> NoReturn:
    """Runs a replica worker until its socket closes."""
    asyncio.run(_main(spec))
    raise AssertionError("unreachable")

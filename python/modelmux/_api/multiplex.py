"""`@serve.multiplexed`: the model loader of a multiplexed deployment.

Inside a replica the server decides which models are loaded: the worker runs the loader only
on the server's `load` order and keeps the result in its model table. Calling the decorated
method returns the table's model; for a model the request does not hold yet (an ensemble), it
asks the server for it first. Outside a replica (a unit test), the method just runs the
loader, uncached.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modelmux._api import context

_ATTR = "__modelmux_multiplexed__"


@dataclass(frozen=True)
class MultiplexConfig:
    """The decorator's arguments and the original loader."""

    func: Callable[..., Any]
    max_num_models_per_replica: int
    max_bytes_per_replica: int | None
    size_bytes: Callable[[Any], int] | None
    # A method taking (self, model_id); else a plain function taking (model_id), which the
    # deployment's methods call (Ray accepts both).
    method: bool = True

    def describe(self) -> dict[str, Any]:
        """The `multiplexed` entry `--inspect` reports."""
        return {
            "max_num_models_per_replica": self.max_num_models_per_replica,
            "max_bytes_per_replica": self.max_bytes_per_replica,
        }


def _check_model_id(model_id: Any) -> None:
    if type(model_id) is not str:
        raise TypeError("The model ID must be a string.")
    if not model_id:
        raise ValueError("The model ID cannot be empty.")


def _not_held(model_id: str) -> RuntimeError:
    return RuntimeError(
        f"model '{model_id}' is not loaded in this replica and no request is in progress: "
        "modelmux loads models for requests only (the server orders each load)"
    )


def _in_this_replica(config: MultiplexConfig, owner: Any) -> Any:
    """The worker runtime when this loader is the replica's own (a method of the replica's
    instance, or the function the replica's deployment multiplexes with); else None, and the
    loader just runs."""
    rt = context.runtime()
    if rt is None:
        return None
    if config.method:
        return rt if rt.instance is owner else None
    return rt if getattr(rt, "multiplexed_func", None) is config.func else None


def _wrap(config: MultiplexConfig) -> Callable[..., Any]:
    func = config.func
    missing = object()

    def split(args: tuple[Any, ...]) -> tuple[Any, str]:
        """(the instance or None, the model id) of a call."""
        if config.method:
            if len(args) != 2:
                raise TypeError(f"{func.__qualname__}() takes (self, model_id)")
            return args[0], args[1]
        if len(args) != 1:
            raise TypeError(f"{func.__qualname__}() takes (model_id)")
        return None, args[0]

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def load_async(*args: Any) -> Any:
            owner, model_id = split(args)
            _check_model_id(model_id)
            rt = _in_this_replica(config, owner)
            if rt is None:
                return await func(*args)
            model = _held_model(rt, model_id, missing)
            if model is not missing:
                return model
            stream = context.request_stream()
            if stream is None:
                raise _not_held(model_id)
            model = await rt.acquire(model_id, stream)
            _mark_held(model_id)
            return model

        wrapper: Callable[..., Any] = load_async
    else:

        @functools.wraps(func)
        def load_sync(*args: Any) -> Any:
            owner, model_id = split(args)
            _check_model_id(model_id)
            rt = _in_this_replica(config, owner)
            if rt is None:
                return func(*args)
            model = _held_model(rt, model_id, missing)
            if model is not missing:
                return model
            stream = context.request_stream()
            if stream is None:
                raise _not_held(model_id)
            if _on_loop_thread(rt.loop):
                raise RuntimeError(
                    f"model '{model_id}' is not loaded yet and a plain (non-async) multiplexed "
                    "method cannot wait for a load on the event loop: make it `async def`, or "
                    "call it from a plain (non-async) method"
                )
            model = asyncio.run_coroutine_threadsafe(rt.acquire(model_id, stream), rt.loop).result()
            _mark_held(model_id)
            return model

        wrapper = load_sync
    setattr(wrapper, _ATTR, config)
    return wrapper


def _held_model(rt: Any, model_id: str, missing: object) -> Any:
    """The model from the worker's table if the server holds it for this request (its own
    model, or one it acquired); else `missing`. A model in the table that the request does not
    hold is acquired first, so the server never unloads a model a request is using."""
    held = context.held_models()
    if held is not None and model_id not in held:
        return missing
    return rt.models.get(model_id, missing)


def _mark_held(model_id: str) -> None:
    held = context.held_models()
    if held is not None:
        held.add(model_id)


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def multiplexed(
    func: Callable[..., Any] | None = None,
    /,
    *,
    max_num_models_per_replica: int = 3,
    max_bytes_per_replica: int | None = None,
    size_bytes: Callable[[Any], int] | None = None,
    allow_sync: bool = False,
    **unknown: Any,
) -> Any:
    """Marks a deployment's method that loads a model by id, as Ray's `@serve.multiplexed`:
    a method `async def get_model(self, model_id)`, or a plain function
    `async def get_model(model_id)` that the deployment's methods call.

    It takes the model id (a non-empty str) and returns the model. As in Ray it must be
    `async def`; `allow_sync=True` (modelmux's own) also takes a plain `def`, which a plain
    method (run in a thread) may call.

    Args:
        max_num_models_per_replica: models one replica holds at most (-1: no limit).
        max_bytes_per_replica: bytes of models one replica holds at most (None: no limit);
            the sizes come from `size_bytes`.
        size_bytes: a callable giving a loaded model's size in bytes.
        allow_sync: accept a plain (non-async) loader.
    """
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise TypeError(f"serve.multiplexed() got unknown argument(s) {names}")
    if isinstance(max_num_models_per_replica, bool) or not isinstance(
        max_num_models_per_replica, int
    ):
        raise TypeError("max_num_models_per_replica must be an int")
    if max_num_models_per_replica < 1 and max_num_models_per_replica != -1:
        raise ValueError("max_num_models_per_replica must be positive, or -1 for no limit")
    if max_bytes_per_replica is not None and (
        isinstance(max_bytes_per_replica, bool)
        or not isinstance(max_bytes_per_replica, int)
        or max_bytes_per_replica < 1
    ):
        raise ValueError("max_bytes_per_replica must be a positive int or None")
    if size_bytes is not None and not callable(size_bytes):
        raise TypeError("size_bytes must be a callable taking the model and returning its bytes")

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isclass(f) or not callable(f):
            raise TypeError(
                "@serve.multiplexed decorates a method (self, model_id) or a function (model_id)"
            )
        params = list(inspect.signature(f).parameters.values())
        if len(params) not in (1, 2):
            raise TypeError(
                f"@serve.multiplexed method {f.__qualname__} must take (self, model_id) or, as "
                f"a plain function, (model_id); it takes ({', '.join(p.name for p in params)})"
            )
        if not inspect.iscoroutinefunction(f) and not allow_sync:
            raise TypeError(
                f"@serve.multiplexed {f.__qualname__} must be `async def` (as in Ray); "
                "modelmux also takes a plain def with allow_sync=True"
            )
        return _wrap(
            MultiplexConfig(
                f,
                max_num_models_per_replica,
                max_bytes_per_replica,
                size_bytes,
                method=len(params) == 2,
            )
        )

    return decorate if func is None else decorate(func)


def find_multiplexed(cls: type) -> tuple[str, MultiplexConfig] | None:
    """The class's multiplexed loader (its name and configuration), if it has one: one of its
    methods, else a multiplexed function its methods call by name (a module-level
    `async def get_model(model_id)`, as Ray allows).

    Raises TypeError when it has more than one.
    """
    found = []
    for name in dir(cls):
        config = getattr(inspect.getattr_static(cls, name), _ATTR, None)
        if isinstance(config, MultiplexConfig):
            found.append((name, config))
    if not found:
        found = _called_functions(cls)
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise TypeError(
            f"deployment class {cls.__name__} has more than one @serve.multiplexed method "
            f"({names}); modelmux keeps one model table per replica"
        )
    return found[0] if found else None


def _called_functions(cls: type) -> list[tuple[str, MultiplexConfig]]:
    """The multiplexed functions the class's own methods name: among their globals, or
    among the variables they close over (a function defined in an enclosing function)."""
    found: dict[int, tuple[str, MultiplexConfig]] = {}
    for attr in vars(cls).values():
        func = getattr(attr, "__func__", attr)
        code = getattr(func, "__code__", None)
        if code is None:
            continue
        names: list[tuple[str, Any]] = [
            (name, getattr(func, "__globals__", {}).get(name)) for name in code.co_names
        ]
        for name, cell in zip(
            code.co_freevars, getattr(func, "__closure__", None) or (), strict=False
        ):
            try:
                names.append((name, cell.cell_contents))
            except ValueError:  # an empty cell
                continue
        for name, value in names:
            config = getattr(value, _ATTR, None)
            if isinstance(config, MultiplexConfig) and not config.method:
                found[id(config)] = (name, config)
    return list(found.values())

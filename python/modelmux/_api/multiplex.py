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
from dataclasses import dataclass
from typing import Any, Callable

from modelmux._api import context

_ATTR = "__modelmux_multiplexed__"


@dataclass(frozen=True)
class MultiplexConfig:
    """The decorator's arguments and the original loader."""

    func: Callable[..., Any]
    max_num_models_per_replica: int
    max_bytes_per_replica: int | None
    size_bytes: Callable[[Any], int] | None

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


def _wrap(config: MultiplexConfig) -> Callable[..., Any]:
    func = config.func
    missing = object()

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def load_async(self: Any, model_id: str) -> Any:
            _check_model_id(model_id)
            rt = context.runtime()
            if rt is None or rt.instance is not self:
                return await func(self, model_id)
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
        def load_sync(self: Any, model_id: str) -> Any:
            _check_model_id(model_id)
            rt = context.runtime()
            if rt is None or rt.instance is not self:
                return func(self, model_id)
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
    **unknown: Any,
) -> Any:
    """Marks a deployment's method that loads a model by id, as Ray's `@serve.multiplexed`.

    The method takes the model id (a non-empty str) and returns the model; async or plain.

    Args:
        max_num_models_per_replica: models one replica holds at most (-1: no limit).
        max_bytes_per_replica: bytes of models one replica holds at most (None: no limit);
            the sizes come from `size_bytes`.
        size_bytes: a callable giving a loaded model's size in bytes.
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
        if not callable(f):
            raise TypeError("@serve.multiplexed decorates a method taking the model id")
        params = list(inspect.signature(f).parameters.values())
        if len(params) != 2:
            raise TypeError(
                f"@serve.multiplexed method {f.__qualname__} must take (self, model_id), "
                f"it takes ({', '.join(p.name for p in params)})"
            )
        return _wrap(
            MultiplexConfig(f, max_num_models_per_replica, max_bytes_per_replica, size_bytes)
        )

    return decorate if func is None else decorate(func)


def find_multiplexed(cls: type) -> tuple[str, MultiplexConfig] | None:
    """The class's multiplexed method (its name and configuration), if it has one.

    Raises TypeError when it has more than one.
    """
    found = []
    for name in dir(cls):
        config = getattr(inspect.getattr_static(cls, name), _ATTR, None)
        if isinstance(config, MultiplexConfig):
            found.append((name, config))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise TypeError(
            f"deployment class {cls.__name__} has more than one @serve.multiplexed method "
            f"({names}); modelmux keeps one model table per replica"
        )
    return found[0] if found else None

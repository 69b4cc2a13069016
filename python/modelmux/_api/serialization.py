"""Pickling of applications, and of handle calls' arguments, results and exceptions."""

from __future__ import annotations

import io
import pickle
from collections import ChainMap
from typing import Any

import cloudpickle
from starlette.datastructures import State


def dumps(obj: Any) -> bytes:
    """`pickle.dumps`, or `cloudpickle.dumps` where plain pickle fails (lambdas, classes
    defined in `__main__` of the process that made the application)."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return data


def dumps_exception(exc: BaseException) -> bytes:
    """A pickled exception, or a RuntimeError naming it when it does not pickle."""
    try:
        return dumps(exc)
    except Exception:
        return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))


def loads(data: bytes) -> Any:
    """Unpickles (cloudpickle's output included)."""
    return pickle.loads(data)


def _reduce_state(state: State) -> tuple[Any, ...]:
    return State, (dict(state._state),)


class _ApplicationPickler(cloudpickle.Pickler):
    """cloudpickle, plus Starlette's `State` (an ASGI app's `app.state`), whose attribute
    fallback makes plain unpickling recurse forever."""

    dispatch_table = ChainMap({State: _reduce_state}, cloudpickle.Pickler.dispatch_table)


def dumps_application(app: Any) -> bytes:
    """An application pickled for the worker (`pickle:` app sources): classes and functions
    that cannot be imported (defined in `__main__`) travel by value, as Ray ships them."""
    buf = io.BytesIO()
    _ApplicationPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(app)
    return buf.getvalue()

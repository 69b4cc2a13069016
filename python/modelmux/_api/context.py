"""Per-request and per-replica context: the multiplexed model id, the replica context, and
the worker runtime that handles and multiplexed loaders talk through inside a replica."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from modelmux._api.exceptions import RayServeException

_model_id: contextvars.ContextVar[str] = contextvars.ContextVar("modelmux_model_id", default="")
_request_stream: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "modelmux_request_stream", default=None
)
# Model ids the server holds for the current request: its own, and those it acquired. One set
# per request, shared by the tasks the request starts (they copy the context, not the set).
_held: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "modelmux_held_models", default=None
)


def get_multiplexed_model_id() -> str:
    """The multiplexed model id of the request being handled (`""` when it has none).

    It comes from the request's `serve_multiplexed_model_id` header, or from the caller's
    `handle.options(multiplexed_model_id=...)`.
    """
    return _model_id.get()


def set_model_id(model_id: str) -> contextvars.Token[str]:
    """Sets the current task's multiplexed model id (used by the worker and `serve.batch`)."""
    return _model_id.set(model_id)


def request_stream() -> int | None:
    """The protocol stream id of the request the current task serves, if any."""
    return _request_stream.get()


def set_request_stream(stream: int, model_id: str) -> None:
    """Marks the current task as serving the request on `stream`, whose own model (held by
    the server for it) is `model_id`."""
    _request_stream.set(stream)
    _held.set({model_id} if model_id else set())


def held_models() -> set[str] | None:
    """The models the server holds for the current request (None outside a request)."""
    return _held.get()


class ReplicaID(str):
    """A replica's id, `"<deployment>#<suffix>"`, as a string; `unique_id` is the suffix."""

    @property
    def unique_id(self) -> str:
        """The part after `#` (the whole id when it has none)."""
        return self.rpartition("#")[2]


@dataclass
class ReplicaContext:
    """What `serve.get_replica_context()` returns inside a replica."""

    app_name: str
    deployment: str
    replica_id: ReplicaID
    servable_object: Any = None

    @property
    def replica_tag(self) -> str:
        """The replica id as a plain string (Ray's older name for it)."""
        return str(self.replica_id)


_replica_context: ReplicaContext | None = None


def get_replica_context() -> ReplicaContext:
    """The context of the replica this code runs in.

    Raises `RayServeException` outside a deployment's replica.
    """
    if _replica_context is None:
        raise RayServeException(
            "`serve.get_replica_context()` may only be called from within a modelmux deployment"
        )
    return _replica_context


def set_replica_context(context: ReplicaContext) -> None:
    """Installs this process's replica context (done once by the worker)."""
    global _replica_context
    _replica_context = context


class CallAnswer(Protocol):
    """A handle call's answer as it arrives (the worker's `PendingCall`)."""

    async def head(self) -> dict[str, Any]:
        """The `CALL_RESULT` head: `ok`, `status`, `exception` or `error`."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The result's bytes as they arrive."""
        ...

    async def read_all(self) -> bytes:
        """The whole result."""
        ...

    def close(self) -> None:
        """Done with it (before its end: the call is cancelled)."""
        ...


class WorkerRuntime(Protocol):
    """The worker side that `modelmux.serve` code reaches inside a replica."""

    loop: asyncio.AbstractEventLoop
    app_name: str
    instance: Any
    models: dict[str, Any]

    async def call(
        self,
        deployment: str,
        app: str | None,
        method: str,
        model_id: str | None,
        payload: bytes,
        stream: bool = False,
    ) -> CallAnswer:
        """Sends a `CALL`; returns its answer as it arrives (to be `close()`d)."""
        ...

    async def acquire(self, model_id: str, stream: int) -> Any:
        """Has the server load `model_id` for the request on `stream`; returns the model."""
        ...

    def ingress_name(self) -> str:
        """The name of this application's ingress deployment."""
        ...


_runtime: WorkerRuntime | None = None


def runtime() -> WorkerRuntime | None:
    """The worker runtime, inside a replica; None elsewhere (a driver, a unit test)."""
    return _runtime


def set_runtime(rt: WorkerRuntime) -> None:
    """Installs this process's worker runtime (done once by the worker)."""
    global _runtime
    _runtime = rt

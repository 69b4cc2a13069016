"""`@serve.batch`: calls with one item each are queued and run together as one list.

As Ray's: the decorated async function takes a list and returns a list of the same length;
callers pass one item and get their own result. One batch holds calls for one multiplexed
model id only, and inside it `serve.get_multiplexed_model_id()` is that id.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import numbers
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from modelmux._api import context
from modelmux._api.exceptions import BatchSizeMismatchError

_Item = tuple[Any, "asyncio.Future[Any]", contextvars.Context, float]


class _BatchQueue:
    """The calls waiting for one (instance, model id), and the task that batches them."""

    def __init__(
        self,
        run: Callable[[list[Any]], Awaitable[Any]],
        name: str,
        max_batch_size: int,
        wait_s: float,
        max_concurrent_batches: int,
        on_idle: Callable[[], None],
    ) -> None:
        self._run_batch = run
        self._name = name
        self._max = max_batch_size
        self._wait_s = wait_s
        self._slots = asyncio.Semaphore(max_concurrent_batches)
        self._on_idle = on_idle
        self._items: deque[_Item] = deque()
        self._full = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    def put(self, item: Any) -> asyncio.Future[Any]:
        """Queues one call; its future gets the call's result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._items.append((item, future, contextvars.copy_context(), loop.time()))
        if len(self._items) >= self._max:
            self._full.set()
        if self._runner is None:
            self._runner = loop.create_task(self._batches())
        return future

    async def _batches(self) -> None:
        while True:
            await self._slots.acquire()
            batch = await self._collect()
            if not batch:
                self._slots.release()
                self._runner = None
                self._maybe_idle()
                return
            ctx = batch[0][2].copy()
            task = asyncio.get_running_loop().create_task(self._execute(batch), context=ctx)
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        """Lets the queue go once nothing waits and no batch runs: while one runs, the queue
        (and its `max_concurrent_batches` slots) must stay, or the next call would start a
        fresh one and run more batches at once than allowed."""
        if self._runner is None and not self._running and not self._items:
            self._on_idle()

    async def _collect(self) -> list[_Item]:
        loop = asyncio.get_running_loop()
        while self._items and len(self._items) < self._max:
            remaining = self._items[0][3] + self._wait_s - loop.time()
            if remaining <= 0:
                break
            self._full.clear()
            try:
                await asyncio.wait_for(self._full.wait(), remaining)
            except TimeoutError:
                break
        batch: list[_Item] = []
        while self._items and len(batch) < self._max:
            entry = self._items.popleft()
            if not entry[1].done():  # a caller that was cancelled drops out
                batch.append(entry)
        self._full.clear()
        return batch

    async def _execute(self, batch: list[_Item]) -> None:
        try:
            results = await self._run_batch([item for item, _, _, _ in batch])
            if not isinstance(results, list):
                raise TypeError(
                    f"@serve.batch function {self._name} must return a list, "
                    f"it returned {type(results).__name__}"
                )
            if len(results) != len(batch):
                raise BatchSizeMismatchError(
                    f"@serve.batch function {self._name} returned {len(results)} results "
                    f"for a batch of {len(batch)} calls"
                )
            for (_, future, _, _), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        except Exception as e:
            for _, future, _, _ in batch:
                if not future.done():
                    future.set_exception(e)
        except asyncio.CancelledError:
            for _, future, _, _ in batch:
                future.cancel()
            raise
        finally:
            self._slots.release()


def batch(
    func: Callable[..., Any] | None = None,
    /,
    *,
    max_batch_size: int = 10,
    batch_wait_timeout_s: float = 0.01,
    max_concurrent_batches: int = 1,
    **unknown: Any,
) -> Any:
    """Batches calls of an async function (or method) taking a list and returning a list.

    Args:
        max_batch_size: the most calls in one batch.
        batch_wait_timeout_s: how long the first call of a batch waits for more.
        max_concurrent_batches: batches of one queue that may run at once.
    """
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise TypeError(f"serve.batch() got unknown argument(s) {names}")
    if (
        isinstance(max_batch_size, bool)
        or not isinstance(max_batch_size, int)
        or max_batch_size < 1
    ):
        raise ValueError(f"max_batch_size must be a positive int, got {max_batch_size!r}")
    if (
        isinstance(batch_wait_timeout_s, bool)
        or not isinstance(batch_wait_timeout_s, numbers.Real)
        or batch_wait_timeout_s < 0
    ):
        raise ValueError(
            f"batch_wait_timeout_s must be a number >= 0, got {batch_wait_timeout_s!r}"
        )
    if (
        isinstance(max_concurrent_batches, bool)
        or not isinstance(max_concurrent_batches, int)
        or max_concurrent_batches < 1
    ):
        raise ValueError(
            f"max_concurrent_batches must be a positive int, got {max_concurrent_batches!r}"
        )

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(f):
            raise TypeError(f"@serve.batch needs an `async def` function, {f!r} is not one")
        queues: dict[tuple[int, str], _BatchQueue] = {}

        @functools.wraps(f)
        async def call(*args: Any) -> Any:
            if len(args) == 2:
                owner, item = args
                run: Callable[[list[Any]], Awaitable[Any]] = functools.partial(f, owner)
            elif len(args) == 1:
                owner, item = None, args[0]
                run = f
            else:
                raise TypeError(f"{f.__qualname__} takes one item per call (batched)")
            key = (id(owner), context.get_multiplexed_model_id())
            queue = queues.get(key)
            if queue is None:
                queue = _BatchQueue(
                    run,
                    f.__qualname__,
                    max_batch_size,
                    float(batch_wait_timeout_s),
                    max_concurrent_batches,
                    functools.partial(queues.pop, key, None),
                )
                queues[key] = queue
            return await queue.put(item)

        return call

    return decorate if func is None else decorate(func)

"""Stand-ins for the Ray-private test helpers that Ray Serve's own tests use, so that those tests
run on modelmux (`from modelmux import serve`) with their bodies unchanged.

Ray's originals (ray-project/ray):
- `wait_for_condition`, `async_wait_for_condition`, `SignalActor`: `python/ray/_common/test_utils.py`
  (earlier `python/ray/_private/test_utils.py`);
- `send_signal_on_cancellation`, `get_application_url`, `check_num_replicas_eq`:
  `python/ray/serve/_private/test_utils.py`;
- `SERVE_MULTIPLEXED_MODEL_ID`: `python/ray/serve/_private/constants.py`;
- `ray.get`, `RayActorError`, `RequestCancelledError`: Ray's own (the last two: placeholders).

There is no Ray here. `SignalActor` is an asyncio-Event-like signal that lives in the test
process, behind a tiny threaded HTTP server on 127.0.0.1 (_signal_server.py, started on first
use), so that the replicas (worker processes, which receive the object pickled by cloudpickle)
and the test process reach the same signal. As with a Ray actor, `signal.<method>.remote(...)` starts the
call at once and returns a reference: `await ref` (in a replica, or in an async test) or
`ray.get(ref)` (in the test process) waits for its result.

`replica_to_model_ids(handle)` replaces Ray's private router state
(`handle._router._asyncio_router._request_router.curr_replicas[...].multiplexed_model_ids`)
with what modelmux documents for the same: `GET /-/models`, whose JSON
(crates/serve/src/controller/report.rs, `ModelsReport`) is applications -> deployments ->
replicas, each with `loaded` ([{id, ...}]) and `loading` ([id]). Ray's `multiplexed_model_ids` is
a replica's loaded and loading models, so the two are joined here. The server `serve.run`
starts protects `/-/models` with an admin token of its own; it is read from
`modelmux._api.client.endpoint()` (the one use of a modelmux internal here, a test's reading of
its own server).

This module is registered with cloudpickle to travel by value, so a replica needs no import of it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from typing import Any

import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# The address `serve.run` serves on by default, which Ray's tests use as http://localhost:8000.
SERVE_HOST = "127.0.0.1"
SERVE_PORT = 8000

# ray.serve._private.constants.SERVE_MULTIPLEXED_MODEL_ID: the header naming a request's model.
SERVE_MULTIPLEXED_MODEL_ID = "serve_multiplexed_model_id"


# --- wait_for_condition / async_wait_for_condition (Ray's, same arguments and messages) ---


def wait_for_condition(
    condition_predictor, timeout=10, retry_interval_ms=100, raise_exceptions=False, **kwargs
):
    """Waits until `condition_predictor(**kwargs)` is true; RuntimeError after `timeout` s."""
    start = time.time()
    last_ex = None
    while time.time() - start <= timeout:
        try:
            if condition_predictor(**kwargs):
                return
        except Exception:
            if raise_exceptions:
                raise
            last_ex = traceback.format_exc()
        time.sleep(retry_interval_ms / 1000.0)
    message = "The condition wasn't met before the timeout expired."
    if last_ex is not None:
        message += f" Last exception: {last_ex}"
    raise RuntimeError(message)


async def async_wait_for_condition(
    condition_predictor, timeout=10, retry_interval_ms=100, **kwargs
):
    """`wait_for_condition` for a coroutine: the predictor may be sync or async."""
    start = time.time()
    last_ex = None
    while time.time() - start <= timeout:
        try:
            if inspect.iscoroutinefunction(condition_predictor):
                if await condition_predictor(**kwargs):
                    return
            else:
                if condition_predictor(**kwargs):
                    return
        except Exception as ex:
            last_ex = ex
        await asyncio.sleep(retry_interval_ms / 1000.0)
    message = "The condition wasn't met before the timeout expired."
    if last_ex is not None:
        message += f" Last exception: {last_ex}"
    raise RuntimeError(message)


# --- SignalActor, over HTTP to the test process (its server: _signal_server.py) ---


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ObjectRef:
    """The pending result of `signal.<method>.remote(...)`: the call already runs (in a
    thread); `await` it, or `ray.get(...)` it."""

    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future

    def __await__(self):
        return asyncio.wrap_future(self._future).__await__()

    def _get(self, timeout: float | None) -> Any:
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise GetTimeoutError(f"Get timed out: the call did not finish in {timeout} s") from None


class _ActorMethod:
    def __init__(self, url: str, sid: int, method: str) -> None:
        self._url = url
        self._sid = sid
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> ObjectRef:
        future: concurrent.futures.Future = concurrent.futures.Future()
        body = json.dumps({"args": args, "kwargs": kwargs}).encode()
        url = f"{self._url}/{self._sid}/{self._method}"

        def run() -> None:
            try:
                req = urllib.request.Request(
                    url, data=body, headers={"content-type": "application/json"}, method="POST"
                )
                try:
                    with _opener().open(req) as resp:
                        answer = json.loads(resp.read())
                except urllib.error.HTTPError as e:
                    with e:
                        answer = json.loads(e.read())
                if "error" in answer:
                    raise RuntimeError(answer["error"])
                future.set_result(answer["result"])
            except BaseException as e:
                future.set_exception(e)

        threading.Thread(target=run, name=f"signal-{self._method}", daemon=True).start()
        return ObjectRef(future)


class SignalActor:
    """Ray's SignalActor: `signal = SignalActor.remote()`, then `signal.wait.remote()`,
    `signal.send.remote(clear=False)` and `signal.cur_num_waiters.remote()`, from the test
    process or from a replica."""

    def __init__(self, url: str, sid: int) -> None:
        self._url = url
        self._sid = sid

    @classmethod
    def remote(cls) -> SignalActor:
        # The signals live in the test process (_signal_server.py, imported here only: the
        # replicas get this class by value, not the server and its locks).
        from _signal_server import signal_server

        server = signal_server()
        return cls(server.url, server.new())

    @property
    def send(self) -> _ActorMethod:
        return _ActorMethod(self._url, self._sid, "send")

    @property
    def wait(self) -> _ActorMethod:
        return _ActorMethod(self._url, self._sid, "wait")

    @property
    def cur_num_waiters(self) -> _ActorMethod:
        return _ActorMethod(self._url, self._sid, "cur_num_waiters")

    def __repr__(self) -> str:
        return f"SignalActor({self._url}/{self._sid})"


class GetTimeoutError(TimeoutError):
    """Ray's `ray.exceptions.GetTimeoutError` (a TimeoutError)."""


class _Ray:
    """The part of the `ray` module these tests use: `ray.get`."""

    @staticmethod
    def get(refs: Any, timeout: float | None = None) -> Any:
        if isinstance(refs, list):
            return [_Ray.get(r, timeout=timeout) for r in refs]
        if not isinstance(refs, ObjectRef):
            raise TypeError(f"ray.get() takes a reference returned by .remote(), not {refs!r}")
        return refs._get(timeout)


ray = _Ray()


# --- ray.serve._private.test_utils ---


@asynccontextmanager
async def send_signal_on_cancellation(signal_actor: SignalActor):
    """Ray's: waits in the block; when cancelled there, sends the signal. (Ray's also clears
    `ray._raylet.async_task_id`, which has no counterpart here.)"""
    cancelled = False
    try:
        yield
        await asyncio.sleep(100)
    except asyncio.CancelledError:
        cancelled = True
        await signal_actor.send.remote()

    if not cancelled:
        raise RuntimeError(
            "CancelledError wasn't raised during `send_signal_on_cancellation` block"
        )


def get_application_url(
    protocol: str = "HTTP",
    app_name: str = "default",
    use_localhost: bool = True,
    exclude_route_prefix: bool = False,
) -> str:
    """Ray's: the URL of an application's HTTP route, `http://localhost:8000<route_prefix>`
    (no trailing slash: the tests append their path)."""
    from modelmux import serve

    if str(protocol).upper() != "HTTP":
        raise ValueError(f"modelmux serves HTTP only, not {protocol!r}")
    host = "localhost" if use_localhost else SERVE_HOST
    route_prefix = ""
    if not exclude_route_prefix:
        app = serve.status().applications.get(app_name)
        if app is None:
            raise ValueError(f"no application named {app_name!r} is running")
        route_prefix = app.route_prefix
    return f"http://{host}:{SERVE_PORT}{route_prefix}".rstrip("/")


def check_num_replicas_eq(name: str, target: int, app_name: str = "default") -> bool:
    """Ray's: the deployment `name` has `target` replicas running (here: taking requests, as
    `serve.status()` reports them)."""
    from modelmux import serve

    deployment = serve.status().applications[app_name].deployments[name]
    running = deployment.replica_states.get("RUNNING", 0)
    assert running == target, f"{name}: {running} replicas running, not {target}"
    return True


class RayActorError(Exception):
    """Ray's `ray.exceptions.RayActorError` (a replica's actor died). There are no actors here:
    nothing raises it; the tests that name it also accept any Exception."""


try:  # Ray's ray.serve.exceptions.RequestCancelledError, if modelmux gets one
    from modelmux.serve.exceptions import RequestCancelledError
except ImportError:

    class RequestCancelledError(Exception):
        """Stands for Ray's `ray.serve.exceptions.RequestCancelledError`, which
        `modelmux.serve.exceptions` lacks: nothing raises this one, so a test expecting it
        fails there (and is marked xfail)."""


# --- the replicas' models, from GET /-/models (in place of Ray's router state) ---


def models_report() -> dict[str, Any]:
    """`GET http://127.0.0.1:8000/-/models` of the server `serve.run` started."""
    from modelmux._api import client

    req = urllib.request.Request(
        f"http://{SERVE_HOST}:{SERVE_PORT}/-/models",
        headers={"authorization": f"Bearer {client.endpoint().token}"},
    )
    with _opener().open(req, timeout=10) as resp:
        return json.loads(resp.read())


def replica_to_model_ids(handle: Any) -> dict[str, set[str]]:
    """Each replica (by id) of the handle's deployment, with its loaded and loading models:
    what Ray's `{tag: replica.multiplexed_model_ids for tag, replica in
    request_router.curr_replicas.items()}` gives."""
    app_name = handle.app_name or "default"
    for app in models_report()["applications"]:
        if app["name"] != app_name:
            continue
        for deployment in app["deployments"]:
            if deployment["name"] == handle.deployment_name:
                return {
                    replica["id"]: {m["id"] for m in replica["loaded"]} | set(replica["loading"])
                    for replica in deployment["replicas"]
                }
    raise LookupError(
        f"/-/models has no deployment {handle.deployment_name!r} in application {app_name!r}"
    )

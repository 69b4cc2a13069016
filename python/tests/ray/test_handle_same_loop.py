"""Ray Serve's "router in the caller's loop" handle tests, ported to modelmux.

From ray-project/ray, python/ray/serve/tests/test_handle_same_loop.py at commit
b6ce15d99a50cf7935706990d1fd1122842772e6 (the version the code index names for that path; the
other stored one, 037d4e5e, is older). Ray runs this file with
RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0 (its handle's router then runs on the caller's event
loop). modelmux has no in-process router at all (the server routes), so only the tests whose
assertions are about the public API, and hold whatever loop a router would run on, are ported:
`test_deployment_handle_works_with_await_when_router_in_same_loop`,
`test_deployment_handle_result_fails_in_async_context_but_await_succeeds`,
`test_http_proxy_requests_work_when_router_in_same_loop`,
`test_deployment_handle_exception_propagation_in_same_loop`,
`test_concurrent_requests_in_same_loop`.

Changed, and why:
- imports: `from ray import serve` -> `from modelmux import serve`.
- `_skip_test_if_router_running_in_separate_loop`: Ray's fixture skips these tests when its
  router runs in a separate loop (a Ray-private flag). modelmux's router is the server, in
  neither of the caller's loops: the fixture is kept by name and skips nothing (these tests never
  skip).
- `serve_instance_async` is conftest.py's async counterpart of `serve_instance`.

Not ported: `test_deployment_handle_result_fails_when_driver_not_in_async_loop` (it asserts
that `.result()` in a plain, loop-less driver raises RuntimeError, as Ray's same-loop router
mode does; the README says the opposite of modelmux: `.result()` works in plain code),
`test_deployment_handle_configured_for_same_loop_via_init` and
`test_child_deployment_handle_configured_for_same_loop_communication` (Ray-private
`handle._init(_run_router_in_separate_loop=False)`), `test_streaming_response_generator_in_same_loop`
(`stream=True` from the driver: refused), `test_request_cancellation_in_same_loop`
(`DeploymentResponse.cancel()` and `RequestCancelledError`: not in the README),
`test_multiple_awaits` (a function deployment: refused).
"""

import asyncio
import sys

import httpx
import pytest

from modelmux import serve


@pytest.fixture
def _skip_test_if_router_running_in_separate_loop():
    # Ray: `if RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP: pytest.skip(...)`. modelmux routes in
    # the server, in neither loop: nothing to skip.
    pass


@pytest.mark.asyncio
async def test_deployment_handle_works_with_await_when_router_in_same_loop(
    serve_instance_async, _skip_test_if_router_running_in_separate_loop
):
    @serve.deployment
    class F:
        async def __call__(self):
            return "hi"

    h = serve.run(F.bind())
    assert await h.remote() == "hi"


@pytest.mark.asyncio
async def test_deployment_handle_result_fails_in_async_context_but_await_succeeds(
    serve_instance_async, _skip_test_if_router_running_in_separate_loop
):
    @serve.deployment
    class F:
        def __call__(self):
            return "hi"

    h = serve.run(F.bind())
    with pytest.raises(RuntimeError):
        h.remote().result()

    assert await h.remote() == "hi"


def test_http_proxy_requests_work_when_router_in_same_loop(
    serve_instance, _skip_test_if_router_running_in_separate_loop
):
    @serve.deployment
    class F:
        def __call__(self):
            return "hi"

    serve.run(F.bind())
    url = "http://localhost:8000/"

    resp = httpx.get(url)
    assert resp.status_code == 200
    assert resp.text == "hi"


@pytest.mark.asyncio
async def test_deployment_handle_exception_propagation_in_same_loop(
    serve_instance_async, _skip_test_if_router_running_in_separate_loop
):
    """Test that exceptions are properly propagated when router runs in same loop."""

    @serve.deployment
    class FailingDeployment:
        def __call__(self):
            raise ValueError("Intentional test error")

    h = serve.run(FailingDeployment.bind())

    with pytest.raises(ValueError, match="Intentional test error"):
        await h.remote()


@pytest.mark.asyncio
async def test_concurrent_requests_in_same_loop(
    serve_instance_async, _skip_test_if_router_running_in_separate_loop
):
    """Test that multiple concurrent requests work correctly in same loop mode."""

    @serve.deployment
    class ConcurrentDeployment:
        async def slow_operation(self, delay: float, value: str):
            await asyncio.sleep(delay)
            return f"result-{value}"

    h = serve.run(ConcurrentDeployment.bind())

    # Launch multiple concurrent requests
    tasks = [
        h.slow_operation.remote(0.1, "a"),
        h.slow_operation.remote(0.1, "b"),
        h.slow_operation.remote(0.1, "c"),
    ]

    # All should complete successfully
    results = await asyncio.gather(*tasks)
    assert set(results) == {"result-a", "result-b", "result-c"}


if __name__ == "__main__":
    sys.exit(pytest.main(["-v", "-s", __file__]))

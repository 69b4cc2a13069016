"""Ray Serve's streaming handle tests, ported to modelmux.

From ray-project/ray, python/ray/serve/tests/test_handle_streaming.py at commit
90a99518588b926d3d72600a5474890835df8f17 (the version the code index names for that path; the
other stored one, 04c73ad3, is the older RayServeHandle / object-ref version).

Ported: `TestAppHandleStreaming::test_call_gen_without_stream_flag` (a driver call without
`stream=True`) and all of `TestDeploymentHandleStreaming` (`stream=True` handles inside a
deployment): `test_basic`, `test_call_gen_without_stream_flag`,
`test_call_no_gen_with_stream_flag`, `test_generator_yields_no_results`,
`test_exception_raised_in_gen`, `test_call_multiple_downstreams`, each for `AsyncStreamer` and
`SyncStreamer`.

Changed, and why:
- imports: `from ray import serve` -> `from modelmux import serve`, `ray.serve.Deployment` /
  `ray.serve.handle` -> `modelmux.serve.Deployment` / `modelmux.serve.handle`.
- the module-level function deployments `sync_gen_function` and `async_gen_function` (used only by
  `TestGeneratorFunctionDeployment`) are left out: modelmux refuses `@serve.deployment` on a
  function with TypeError, which at module level would stop this whole file from loading.
- Tests whose Ray assertion does not hold on modelmux today are marked `xfail(strict=True)`
  with the reason; their bodies are Ray's.

Not ported: `TestAppHandleStreaming::test_basic`, `::test_call_no_gen_with_stream_flag`,
`::test_generator_yields_no_results`, `::test_exception_raised_in_gen` (`stream=True` handle
calls from the driver, which the README lists as refused), `TestGeneratorFunctionDeployment`
(function deployments, refused).
"""

import sys
from typing import AsyncGenerator, Generator

import pytest

from modelmux import serve
from modelmux.serve import Deployment
from modelmux.serve.handle import DeploymentHandle


@serve.deployment
class AsyncStreamer:
    async def __call__(
        self, n: int, should_error: bool = False
    ) -> AsyncGenerator[int, None]:
        if should_error:
            raise RuntimeError("oopsies")

        for i in range(n):
            yield i

    async def other_method(self, n: int) -> AsyncGenerator[int, None]:
        for i in range(n):
            yield i

    async def call_inner_generator(self, n: int) -> AsyncGenerator[int, None]:
        return self.other_method(n)

    async def unary(self, n: int) -> int:
        return n


@serve.deployment
class SyncStreamer:
    def __call__(
        self, n: int, should_error: bool = False
    ) -> Generator[int, None, None]:
        if should_error:
            raise RuntimeError("oopsies")

        for i in range(n):
            yield i

    def other_method(self, n: int) -> Generator[int, None, None]:
        for i in range(n):
            yield i

    def call_inner_generator(self, n: int) -> Generator[int, None, None]:
        return self.other_method(n)

    def unary(self, n: int) -> int:
        return n


# Not ported (function deployments, refused by modelmux at decoration):
# @serve.deployment
# def sync_gen_function(n: int): ...
# @serve.deployment
# async def async_gen_function(n: int): ...


@pytest.mark.parametrize("deployment", [AsyncStreamer, SyncStreamer])
class TestAppHandleStreaming:
    @pytest.mark.xfail(
        strict=True,
        reason=(
            "modelmux refuses the call with its own message, not Ray's: pytest.raises(TypeError, "
            "match=\"Method '__call__' returned a generator. You must use "
            "`handle.options\\(stream=True\\)` to call generators on a deployment.\") fails: "
            "Regex pattern did not match. Actual message: '<AsyncStreamer|SyncStreamer>.__call__ "
            "returned a generator: call it through handle.options(stream=True) to get its items'"
        ),
    )
    def test_call_gen_without_stream_flag(self, serve_instance, deployment: Deployment):
        h = serve.run(deployment.bind())

        with pytest.raises(
            TypeError,
            match=(
                r"Method '__call__' returned a generator. You must use "
                r"`handle.options\(stream=True\)` to call generators on a deployment."
            ),
        ):
            h.remote(5).result()

        with pytest.raises(
            TypeError,
            match=(
                r"Method 'call_inner_generator' returned a generator. You must use "
                r"`handle.options\(stream=True\)` to call generators on a deployment."
            ),
        ):
            h.call_inner_generator.remote(5).result()


@pytest.mark.parametrize("deployment", [AsyncStreamer, SyncStreamer])
class TestDeploymentHandleStreaming:
    def test_basic(self, serve_instance, deployment: Deployment):
        @serve.deployment
        class Delegate:
            def __init__(self, streamer: DeploymentHandle):
                self._h = streamer

            async def __call__(self):
                h = self._h.options(stream=True)

                # Test calling __call__ generator.
                gen = h.remote(5)
                assert [result async for result in gen] == list(range(5))

                # Test calling another method name.
                gen = h.other_method.remote(5)
                assert [result async for result in gen] == list(range(5))

                # Test calling another method name via `.options`.
                gen = h.options(method_name="other_method").remote(5)
                assert [result async for result in gen] == list(range(5))

                # Test calling a unary method on the same deployment.
                assert await h.options(stream=False).unary.remote(5) == 5

        h = serve.run(Delegate.bind(deployment.bind()))
        h.remote().result()

    @pytest.mark.xfail(
        strict=True,
        reason=(
            "modelmux refuses the call with its own message, not Ray's: pytest.raises(TypeError, "
            "match=\"Method '__call__' returned a generator. You must use "
            "`handle.options\\(stream=True\\)` to call generators on a deployment.\") fails: "
            "Regex pattern did not match. Actual message: '<AsyncStreamer|SyncStreamer>.__call__ "
            "returned a generator: call it through handle.options(stream=True) to get its items'"
        ),
    )
    def test_call_gen_without_stream_flag(self, serve_instance, deployment: Deployment):
        @serve.deployment
        class Delegate:
            def __init__(self, streamer: DeploymentHandle):
                self._h = streamer

            async def __call__(self):
                with pytest.raises(
                    TypeError,
                    match=(
                        r"Method '__call__' returned a generator. You must use "
                        r"`handle.options\(stream=True\)` to call generators on a "
                        r"deployment."
                    ),
                ):
                    await self._h.remote(5)

                with pytest.raises(
                    TypeError,
                    match=(
                        r"Method 'call_inner_generator' returned a generator. You must "
                        r"use `handle.options\(stream=True\)` to call generators on a "
                        r"deployment."
                    ),
                ):
                    await self._h.call_inner_generator.remote(5)

        h = serve.run(Delegate.bind(deployment.bind()))
        h.remote().result()

    @pytest.mark.xfail(
        strict=True,
        reason=(
            "modelmux's message differs from Ray's: pytest.raises(TypeError, "
            "match=r\"'unary' .* but it did not return a generator\") fails: Regex pattern did "
            "not match. Actual message: '<AsyncStreamer|SyncStreamer>.unary was called with "
            "stream=True but returned int, not a generator'"
        ),
    )
    def test_call_no_gen_with_stream_flag(self, serve_instance, deployment: Deployment):
        @serve.deployment
        class Delegate:
            def __init__(self, streamer: DeploymentHandle):
                self._h = streamer

            async def __call__(self):
                h = self._h.options(stream=True)

                gen = h.unary.remote(0)
                with pytest.raises(
                    TypeError,
                    match=r"'unary' .* but it did not return a generator",
                ):
                    await gen.__anext__()

        h = serve.run(Delegate.bind(deployment.bind()))
        h.remote().result()

    def test_generator_yields_no_results(self, serve_instance, deployment: Deployment):
        @serve.deployment
        class Delegate:
            def __init__(self, streamer: DeploymentHandle):
                self._h = streamer

            async def __call__(self):
                h = self._h.options(stream=True)

                gen = h.remote(0)
                with pytest.raises(StopAsyncIteration):
                    await gen.__anext__()

        h = serve.run(Delegate.bind(deployment.bind()))
        h.remote().result()

    def test_exception_raised_in_gen(self, serve_instance, deployment: Deployment):
        @serve.deployment
        class Delegate:
            def __init__(self, streamer: DeploymentHandle):
                self._h = streamer

            async def __call__(self):
                h = self._h.options(stream=True)

                gen = h.remote(0, should_error=True)
                with pytest.raises(RuntimeError, match="oopsies"):
                    await gen.__anext__()

        h = serve.run(Delegate.bind(deployment.bind()))
        h.remote().result()

    def test_call_multiple_downstreams(self, serve_instance, deployment: Deployment):
        @serve.deployment
        class Delegate:
            def __init__(
                self, streamer1: DeploymentHandle, streamer2: DeploymentHandle
            ):
                self._h1 = streamer1.options(stream=True)
                self._h2 = streamer2.options(stream=True)

            async def __call__(self):
                gen1 = self._h1.remote(1)
                gen2 = self._h2.remote(2)

                assert await gen1.__anext__() == 0
                assert await gen2.__anext__() == 0

                with pytest.raises(StopAsyncIteration):
                    assert await gen1.__anext__()
                assert await gen2.__anext__() == 1

                with pytest.raises(StopAsyncIteration):
                    assert await gen1.__anext__()
                with pytest.raises(StopAsyncIteration):
                    assert await gen2.__anext__()

        h = serve.run(
            Delegate.bind(deployment.bind(), deployment.bind()),
        )
        h.remote().result()


if __name__ == "__main__":
    sys.exit(pytest.main(["-v", "-s", __file__]))

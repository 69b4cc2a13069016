"""Ray's model composition example (Upstream calls Downstream through a handle)."""

import starlette.requests

from modelmux import serve
from modelmux.serve.handle import DeploymentHandle


@serve.deployment
class Downstream:
    def __call__(self):
        return serve.get_multiplexed_model_id()

    def square(self, x: int) -> int:
        return x * x

    def fail(self) -> None:
        raise LookupError("downstream failed")

    def size(self, blob: bytes) -> int:
        return len(blob)

    def blob(self, n: int) -> bytes:
        return bytes(range(256)) * (n // 256)

    def count(self, n: int):
        for i in range(n):
            yield i

    async def acount(self, n: int, fail_at: int | None = None):
        for i in range(n):
            if i == fail_at:
                raise ValueError(f"failed at {i}")
            yield {"i": i}

    def not_a_generator(self, n: int) -> int:
        return n


@serve.deployment
class Upstream:
    def __init__(self, downstream: DeploymentHandle, others: dict):
        self._h = downstream
        self._others = others

    async def __call__(self, request: starlette.requests.Request):
        path = request.url.path
        if path == "/plain":
            return await self._h.remote()
        if path == "/square":
            return await self._h.square.remote(7)
        if path == "/chained":
            return await self._h.square.remote(self._h.square.remote(3))
        if path == "/other":
            return await self._others["helpers"][0].remote()
        if path == "/blocking":
            return self._h.remote().result()
        if path == "/big-args":
            return await self._h.size.remote(b"y" * (3 * 1024 * 1024 + 5))
        if path == "/big-result":
            blob = await self._h.blob.remote(5 * 1024 * 1024)
            return {"len": len(blob), "ok": blob == bytes(range(256)) * (5 * 4096)}
        if path == "/stream":
            return [x async for x in self._h.options(stream=True).acount.remote(4)]
        if path == "/stream-fail":
            got = []
            try:
                async for x in self._h.options(stream=True).acount.remote(5, fail_at=2):
                    got.append(x)
            except ValueError as e:
                return {"got": got, "error": str(e)}
            return {"got": got, "error": None}
        if path == "/stream-first":
            gen = self._h.options(stream=True).acount.remote(1000)
            async for x in gen:
                gen.cancel()
                return x
        return await self._h.options(multiplexed_model_id="bar").remote()


@serve.deployment
class SyncCaller:
    def __init__(self, downstream: DeploymentHandle):
        self._h = downstream

    def __call__(self, request: starlette.requests.Request):
        if request.url.path == "/stream":
            return list(self._h.options(stream=True).count.remote(3))
        return self._h.options(multiplexed_model_id="sync").square.remote(5).result(timeout_s=10)


downstream = Downstream.bind()
app = Upstream.bind(downstream, {"helpers": [Downstream.options(name="Helper").bind()]})
sync_app = SyncCaller.bind(downstream)

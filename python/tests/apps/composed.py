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
        return await self._h.options(multiplexed_model_id="bar").remote()


@serve.deployment
class SyncCaller:
    def __init__(self, downstream: DeploymentHandle):
        self._h = downstream

    def __call__(self, request: starlette.requests.Request):
        return self._h.options(multiplexed_model_id="sync").square.remote(5).result(timeout_s=10)


downstream = Downstream.bind()
app = Upstream.bind(downstream, {"helpers": [Downstream.options(name="Helper").bind()]})
sync_app = SyncCaller.bind(downstream)

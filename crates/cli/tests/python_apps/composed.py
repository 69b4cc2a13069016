"""The seed's composition example: Upstream calls Downstream through a handle with a model id."""

import starlette.requests

from modelmux import serve
from modelmux.serve.handle import DeploymentHandle


@serve.deployment
class Downstream:
    def __call__(self):
        return serve.get_multiplexed_model_id()


@serve.deployment
class Upstream:
    def __init__(self, downstream: DeploymentHandle):
        self._h = downstream

    async def __call__(self, request: starlette.requests.Request):
        if request.url.path.endswith("/plain"):
            # No options: the callee must not see this request's own model id.
            return {"mine": serve.get_multiplexed_model_id(), "callee": await self._h.remote()}
        return await self._h.options(multiplexed_model_id="bar").remote()


app = Upstream.bind(Downstream.bind())

"""An ingress that calls a multiplexed deployment through a handle with a model id.

Every answer names the replicas that made it (`deployment#tag@node` in a cluster), so a test can
see which node served the call. Each load is appended to the file MODELMUX_TEST_LOAD_LOG names,
as `<replica> <model id>`.
"""

import os

import starlette.requests

from modelmux import serve
from modelmux.serve.handle import DeploymentHandle


def _replica() -> str:
    return serve.get_replica_context().replica_tag


@serve.deployment
class Holder:
    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        path = os.environ.get("MODELMUX_TEST_LOAD_LOG")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{_replica()} {model_id}\n")
        return {"id": model_id}

    async def __call__(self):
        model = await self.get_model(serve.get_multiplexed_model_id())
        return {"model": model["id"], "holder": _replica()}

    async def items(self, n: int):
        model = await self.get_model(serve.get_multiplexed_model_id())
        for i in range(n):
            yield f"{model['id']}:{i}@{_replica()}"


@serve.deployment
class Front:
    def __init__(self, holder: DeploymentHandle):
        self._holder = holder

    async def __call__(self, request: starlette.requests.Request):
        model = request.query_params["model"]
        if request.url.path == "/stream":
            holder = self._holder.options(multiplexed_model_id=model, stream=True)
            return [item async for item in holder.items.remote(3)]
        answer = await self._holder.options(multiplexed_model_id=model).remote()
        return {"ingress": _replica(), **answer}


app = Front.bind(Holder.bind())

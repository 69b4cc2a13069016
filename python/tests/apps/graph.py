"""Ray's composition example with options, for --inspect."""

from modelmux import serve
from modelmux.serve.handle import DeploymentHandle


@serve.deployment(num_replicas=2)
class Downstream:
    @serve.multiplexed(max_num_models_per_replica=3)
    async def get_model(self, model_id: str):
        return model_id

    def __call__(self):
        return serve.get_multiplexed_model_id()


@serve.deployment(max_ongoing_requests=5, user_config={"a": 1}, version="v1")
class Upstream:
    def __init__(self, downstream: DeploymentHandle, more: list):
        self._h = downstream

    def reconfigure(self, config):
        pass

    async def __call__(self, request):
        return await self._h.options(multiplexed_model_id="bar").remote()


downstream = Downstream.bind()
app = Upstream.bind(downstream, [downstream, Downstream.options(name="Second").bind()])

"""`@serve.batch` in a multiplexed deployment: each answer says which batch it was in."""

import asyncio

import starlette.requests

from modelmux import serve


@serve.deployment(max_ongoing_requests=64)
class Batched:
    @serve.multiplexed(max_num_models_per_replica=4)
    async def get_model(self, model_id: str):
        return model_id

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)
    async def handle(self, items: list) -> list:
        model_id = serve.get_multiplexed_model_id()
        await asyncio.sleep(0.01)
        ids = [item for item in items]
        return [{"model": model_id, "batch": ids} for _ in items]

    async def __call__(self, request: starlette.requests.Request):
        model_id = serve.get_multiplexed_model_id()
        await self.get_model(model_id)
        return await self.handle(model_id)


app = Batched.bind()

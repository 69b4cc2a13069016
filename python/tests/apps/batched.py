"""Batching per multiplexed model id."""

import asyncio
import json
import os

from starlette.requests import Request

from modelmux import serve

OUT = os.environ.get("MODELMUX_TEST_OUT", ".")


@serve.deployment
class Batched:
    @serve.multiplexed(max_num_models_per_replica=5)
    async def get_model(self, model_id: str):
        return {"id": model_id}

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.2)
    async def predict(self, items: list):
        model_id = serve.get_multiplexed_model_id()
        model = await self.get_model(model_id)
        with open(os.path.join(OUT, "batches"), "a") as f:
            f.write(json.dumps({"model": model_id, "items": items}) + "\n")
        await asyncio.sleep(0.01)
        return [{"batch_model": model["id"], "item": item, "size": len(items)} for item in items]

    async def __call__(self, request: Request):
        return await self.predict(int(request.query_params["i"]))


entry = Batched.bind()

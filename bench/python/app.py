"""The Python deployments benchmark's application, served as it is by modelmux and, with its
import changed to `from ray import serve`, by Ray Serve (`scripts/bench-python` makes that copy).

- `one_model`: one multiplexed model, a trivial `__call__`.
- `zipf`: bench/ray-peer.yaml's workload in Python: 4 replicas of 4 models, 100 ms loads,
  max_ongoing_requests 5. Each load appends a line to $BENCH_LOAD_LOG, so the hit ratio is
  counted the same way for both servers.
"""

import asyncio
import os

from modelmux import serve


def _count_load(model_id: str) -> None:
    path = os.environ.get("BENCH_LOAD_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(model_id + "\n")


class Model:
    def __init__(self, model_id: str):
        self.model_id = model_id

    def predict(self) -> str:
        return self.model_id


@serve.deployment(max_ongoing_requests=32)
class OneModel:
    @serve.multiplexed(max_num_models_per_replica=3)
    async def get_model(self, model_id: str) -> Model:
        _count_load(model_id)
        return Model(model_id)

    async def __call__(self, request):
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.predict()


@serve.deployment(num_replicas=4, max_ongoing_requests=5)
class ZipfModels:
    @serve.multiplexed(max_num_models_per_replica=4)
    async def get_model(self, model_id: str) -> Model:
        await asyncio.sleep(0.1)
        _count_load(model_id)
        return Model(model_id)

    async def __call__(self, request):
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.predict()


one_model = OneModel.bind()
zipf = ZipfModels.bind()

"""Ray's ModelInferencer example, with numpy weights for models."""

import asyncio
import os

import numpy as np
import starlette.requests

from modelmux import serve

OUT = os.environ.get("MODELMUX_TEST_OUT", ".")


class Model:
    """A linear model whose weights depend on its id."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.weights = np.arange(8, dtype=np.float64).reshape(4, 2) * int(model_id)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weights

    def __del__(self) -> None:
        with open(os.path.join(OUT, "deleted"), "a") as f:
            f.write(f"{self.model_id}\n")


@serve.deployment
class ModelInferencer:
    def __init__(self):
        self.bucket_name = "my_bucket"

    @serve.multiplexed(max_num_models_per_replica=3, size_bytes=lambda m: m.weights.nbytes)
    async def get_model(self, model_id: str):
        if model_id == "666":
            raise ValueError("model 666 is cursed")
        await asyncio.sleep(0)
        return Model(model_id)

    async def __call__(self, request: starlette.requests.Request):
        model_id = serve.get_multiplexed_model_id()
        model = await self.get_model(model_id)
        if request.url.path == "/ensemble":
            others = [await self.get_model(i) for i in request.query_params["ids"].split(",")]
            return {"model_id": model_id, "ensemble": [m.model_id for m in [model, *others]]}
        x = np.array((await request.json())["x"], dtype=np.float64)
        return {"model_id": model_id, "y": model.forward(x)}

    async def weight_sum(self, model_id: str) -> float:
        return float((await self.get_model(model_id)).weights.sum())

    async def check_health(self):
        if os.path.exists(os.path.join(OUT, "probe-unloaded")):
            await self.get_model("12345")


entry = ModelInferencer.bind()

"""The seed's ModelInferencer (Ray's multiplexing example) with numpy weights instead of torch.

Model `id`'s weights are W[i][j] = sin(7 * id + 3 * i + j), 4 inputs by 3 outputs, so a test can
compute the expected answer on its own. Loads and `__del__` calls are appended to the files
named by MODELMUX_TEST_LOAD_LOG and MODELMUX_TEST_DEL_LOG.
"""

import asyncio
import os

import numpy as np
import starlette.requests

from modelmux import serve


def _note(variable: str, line: str) -> None:
    path = os.environ.get(variable)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


class Weights:
    def __init__(self, model_id: str):
        self.model_id = model_id
        i = np.arange(4).reshape(4, 1)
        j = np.arange(3).reshape(1, 3)
        self.w = np.sin(7.0 * float(model_id) + 3.0 * i + j)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x @ self.w

    def __del__(self):
        _note("MODELMUX_TEST_DEL_LOG", self.model_id)


@serve.deployment
class ModelInferencer:
    def __init__(self):
        self.load_delay = float(os.environ.get("MODELMUX_TEST_LOAD_DELAY", "0.05"))

    @serve.multiplexed(max_num_models_per_replica=3)
    async def get_model(self, model_id: str):
        if model_id == "broken":
            raise ValueError("no weights for model broken")
        await asyncio.sleep(self.load_delay)
        _note("MODELMUX_TEST_LOAD_LOG", model_id)
        return Weights(model_id)

    async def __call__(self, request: starlette.requests.Request):
        model_id = serve.get_multiplexed_model_id()
        if request.url.path.endswith("/boom"):
            raise KeyError("boom was asked for")
        model = await self.get_model(model_id)
        if request.url.path.endswith("/slow"):
            await asyncio.sleep(30)
        if request.url.path.endswith("/wait"):
            await asyncio.sleep(2)
        body = await request.json() if request.method == "POST" else {"x": [1.0, 2.0, 3.0, 4.0]}
        y = model.forward(np.asarray(body["x"], dtype=np.float64))
        return {"model": model_id, "y": y.tolist(), "pid": os.getpid()}


entry = ModelInferencer.bind()

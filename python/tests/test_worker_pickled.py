"""A worker running an application pickled by value, as `serve.run` writes it for classes
defined in a driver's `__main__`."""

import json
import os
import tempfile
import unittest

from fastapi import FastAPI

from modelmux import serve
from modelmux._api.serialization import dumps_application
from tests.peer import READY, Peer


def make_app():
    """Classes made here are not importable, so cloudpickle ships them by value."""
    api = FastAPI()

    class Scaler:
        def __init__(self, factor: float) -> None:
            self.factor = factor

    @serve.deployment(name="Scaled")
    @serve.ingress(api)
    class ScaledModels:
        def __init__(self, factor: float) -> None:
            self.factor = factor

        @serve.multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id: str) -> Scaler:
            return Scaler(self.factor * int(model_id))

        @api.get("/scale")
        async def scale(self, x: float) -> dict:
            model = await self.get_model(serve.get_multiplexed_model_id())
            return {"y": x * model.factor}

    return ScaledModels.bind(1.5)


class PickledAppTest(unittest.TestCase):
    def test_by_value_classes_with_fastapi_and_multiplexing(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "app.pkl")
            with open(path, "wb") as f:
                f.write(dumps_application(make_app()))
            peer = Peer(f"pickle:{path}", "Scaled", working_dir=None)
            try:
                self.assertEqual(peer.next(READY).head["multiplexed"], True)
                self.assertEqual(peer.control(1, {"op": "load", "model_id": "4"})["ok"], True)
                resp = peer.get(2, "/scale", query="x=2", model_id="4")
                self.assertEqual(json.loads(resp.body), {"y": 12.0})
            finally:
                self.assertEqual(peer.close(), 0)


if __name__ == "__main__":
    unittest.main()

"""A driver script in the seed's style: `serve.run` twice (two applications, `serve.shutdown()`
between), HTTP requests with `requests`, and a handle call from outside the server. It prints
one JSON line of what it saw and exits; the test checks that nothing it started is left.

The port comes from MODELMUX_TEST_PORT (the seed's examples use 8000)."""

import json
import os

import requests
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
        return await self._h.options(multiplexed_model_id="bar").remote()


@serve.deployment
class Adder:
    def __init__(self, offset: int):
        self.offset = offset

    def add(self, x: int) -> int:
        return x + self.offset

    def __call__(self, request):
        return "adder"


port = int(os.environ["MODELMUX_TEST_PORT"])
serve.start(http_options={"port": port})
seen = {}
serve.run(Upstream.bind(Downstream.bind()))
seen["composed"] = requests.get(f"http://localhost:{port}").text
seen["status"] = serve.status().applications["default"].status
serve.shutdown()

handle = serve.run(Adder.bind(40), name="second", route_prefix="/adder")
seen["http"] = requests.get(f"http://localhost:{port}/adder").text
seen["handle"] = handle.add.remote(2).result(timeout_s=30)
serve.shutdown()
print(json.dumps(seen))

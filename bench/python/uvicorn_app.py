"""The one-model case of app.py with no serving system around it: the same model and
`__call__` behind plain uvicorn (no multiplexing, no routing), the floor the benchmark compares
modelmux's extra hop against."""

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route


class Model:
    def __init__(self, model_id: str):
        self.model_id = model_id

    def predict(self) -> str:
        return self.model_id


_models: dict = {}


async def call(request: Request) -> PlainTextResponse:
    model_id = request.headers.get("serve_multiplexed_model_id", "")
    model = _models.get(model_id)
    if model is None:
        model = _models[model_id] = Model(model_id)
    return PlainTextResponse(model.predict())


app = Starlette(routes=[Route("/", call, methods=["GET", "POST"])])

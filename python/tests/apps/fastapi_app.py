"""A FastAPI ingress with class-based routes and a lifespan."""

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from modelmux import serve


@asynccontextmanager
async def lifespan(app: FastAPI):
    yield {"started": True}


app = FastAPI(lifespan=lifespan)


@app.get("/module-level")
def module_level():
    return {"where": "module"}


@app.get("/state")
def lifespan_state(request: Request):
    return {"started": request.state.started}


@serve.deployment
@serve.ingress(app)
class Api:
    def __init__(self, prefix: str):
        self.prefix = prefix

    @app.get("/hello")
    def hello(self, name: str = "world") -> dict:
        return {"message": f"{self.prefix} {name}", "model_id": serve.get_multiplexed_model_id()}

    @app.post("/items/{item_id}")
    async def create(self, item_id: int, payload: dict) -> dict:
        return {"item_id": item_id, "payload": payload, "prefix": self.prefix}


entry = Api.bind("hi")

"""A plain deployment whose paths exercise the worker's request handling."""

import asyncio
import hashlib
import os
import threading

from starlette.requests import Request
from starlette.responses import StreamingResponse

from modelmux import serve

OUT = os.environ.get("MODELMUX_TEST_OUT", ".")


def note(name: str, text: str) -> None:
    with open(os.path.join(OUT, name), "a") as f:
        f.write(text + "\n")


@serve.deployment
class Behaviors:
    def __init__(self, greeting: str):
        self.greeting = greeting
        self.replica = serve.get_replica_context()

    async def __call__(self, request: Request):
        path = request.url.path
        if path == "/fail":
            raise KeyError("boom")
        if path == "/stream":

            async def chunks():
                for i in range(3):
                    yield f"chunk{i};".encode()
                    await asyncio.sleep(0.01)

            return StreamingResponse(chunks(), media_type="text/plain")
        if path == "/echo":
            body = await request.body()
            return {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        if path == "/wait":
            note("wait", "started")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                message = await request.receive()
                note("wait", f"cancelled {message['type']}")
                raise
            return "not cancelled"
        if path == "/none":
            return None
        if path == "/bytes":
            return b"\x00\x01"
        if path == "/big":
            return bytes(range(256)) * (10 * 1024)  # 2.5 MiB
        if path == "/unjsonable":
            return {"value": object()}
        if path == "/context":
            return {
                "app": self.replica.app_name,
                "deployment": self.replica.deployment,
                "replica_id": str(self.replica.replica_id),
                "unique_id": self.replica.replica_id.unique_id,
                "replica_tag": self.replica.replica_tag,
                "same_instance": serve.get_replica_context().servable_object is self,
                "root_path": request.scope["root_path"],
                "query": request.query_params.get("q"),
                "header": request.headers.get("x-test"),
            }
        return f"{self.greeting} {path}"


entry = Behaviors.bind("hello")


@serve.deployment
class SyncEcho:
    def __call__(self, request: Request):
        return {
            "model_id": serve.get_multiplexed_model_id(),
            "thread": threading.current_thread() is threading.main_thread(),
        }


sync_entry = SyncEcho.bind()


@serve.deployment
class BrokenInit:
    def __init__(self):
        raise RuntimeError("cannot start: no GPU")

    def __call__(self):
        return "never"


broken = BrokenInit.bind()


@serve.deployment(user_config={"threshold": 1})
class Configured:
    def __init__(self):
        self.threshold = None
        self.healthy = True

    def reconfigure(self, config: dict):
        if config.get("threshold") == -1:
            raise ValueError("threshold must be positive")
        self.threshold = config["threshold"]
        self.healthy = config.get("healthy", True)

    async def check_health(self):
        if not self.healthy:
            raise RuntimeError("unhealthy on purpose")

    async def __call__(self, request: Request):
        return {"threshold": self.threshold}


configured = Configured.bind()

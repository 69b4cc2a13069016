"""Handle calls of any size, and a generator's items streamed through a handle
(`handle.options(stream=True)`), as Ray composes a streaming LLM deployment behind another."""

import asyncio
import os

from starlette.requests import Request
from starlette.responses import StreamingResponse

from modelmux import serve
from modelmux.serve.handle import DeploymentHandle


@serve.deployment
class Producer:
    def __init__(self):
        self.closed = 0
        self.released = asyncio.Event()

    async def ticks(self, n: int, every_s: float, gated: bool = False):
        """`n` items `every_s` apart; when `gated`, the second only once `release` is called."""
        try:
            for i in range(n):
                if i == 1 and gated:
                    await self.released.wait()
                    self.released.clear()
                elif i:
                    await asyncio.sleep(every_s)
                yield f"{i}\n"
        finally:
            # Runs when the generator ends, and when its caller went away mid-stream.
            self.closed += 1

    def release(self) -> None:
        self.released.set()

    def closed_count(self) -> int:
        return self.closed

    def reverse(self, blob: bytes) -> bytes:
        return blob[::-1]


@serve.deployment
class Relay:
    def __init__(self, producer: DeploymentHandle):
        self._producer = producer

    async def __call__(self, request: Request):
        path = request.url.path
        if path == "/big":
            n = int(request.query_params["mib"]) * 1024 * 1024
            blob = bytes(range(256)) * (n // 256)
            back = await self._producer.reverse.remote(blob)
            return {"sent": len(blob), "back": len(back), "same": back == blob[::-1]}
        if path == "/closed":
            return await self._producer.closed_count.remote()
        if path == "/release":
            await self._producer.release.remote()
            return "released"
        if path == "/sees-admin-token":
            # Whether the token reaches this worker at all: under its own name, under another
            # one, or on its command line (the test passes its value).
            value = request.query_params["value"]
            with open("/proc/self/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            return {
                "named": "MODELMUX_ADMIN_TOKEN" in os.environ,
                "anywhere": any(value in v for v in os.environ.values()) or value in cmdline,
            }
        n = int(request.query_params.get("n", "5"))
        gated = request.query_params.get("gated") == "1"
        items = self._producer.options(stream=True).ticks.remote(n, 0.25, gated)
        return StreamingResponse(items, media_type="text/plain")


app = Relay.bind(Producer.bind())

"""A StreamingResponse and `reconfigure(user_config)` (`/greeting` says it; `/slow-greeting` after
half a second); `/` streams five lines, the last four only once `/release` has been asked for
(so a client sees whether the first one reached it before the rest were made); `/flood` streams
256 MiB as fast as it can, for a client that never reads it."""

import asyncio

from starlette.responses import StreamingResponse

from modelmux import serve


@serve.deployment(user_config={"greeting": "hello"})
class Streamer:
    def __init__(self):
        self.greeting = None
        self.released = asyncio.Event()

    def reconfigure(self, config: dict):
        self.greeting = config["greeting"]

    async def __call__(self, request):
        if request.url.path.endswith("/slow-greeting"):
            # Held a while, so that requests at once go to different replicas.
            await asyncio.sleep(0.5)
            return self.greeting
        if request.url.path.endswith("/greeting"):
            return self.greeting
        if request.url.path.endswith("/release"):
            self.released.set()
            return "released"
        if request.url.path.endswith("/flood"):
            chunk = b"x" * (64 << 10)

            async def flood():
                for _ in range(4096):
                    yield chunk

            return StreamingResponse(flood(), media_type="application/octet-stream")

        async def count():
            yield "0\n"
            await self.released.wait()
            self.released.clear()
            for i in range(1, 5):
                yield f"{i}\n"

        return StreamingResponse(count(), media_type="text/plain")


app = Streamer.bind()

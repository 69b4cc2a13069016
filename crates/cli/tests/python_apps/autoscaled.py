"""Ray Serve's autoscaling options as a Ray user writes them (only the import differs): a
deployment with `autoscaling_config` whose requests take 300 ms, and one with
`num_replicas="auto"`. Each answers with the id of the process that served it."""

import asyncio
import os

from modelmux import serve


@serve.deployment(
    autoscaling_config={
        "min_replicas": 1,
        "max_replicas": 3,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0,
        "downscale_delay_s": 2,
        "look_back_period_s": 1,
    },
    max_ongoing_requests=2,
)
class Scaled:
    async def __call__(self, request):
        await asyncio.sleep(0.3)
        return str(os.getpid())


@serve.deployment(num_replicas="auto")
class Auto:
    def __call__(self, request):
        return str(os.getpid())


scaled = Scaled.bind()
auto = Auto.bind()

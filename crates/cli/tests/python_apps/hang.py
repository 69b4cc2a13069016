"""A replica whose worker stops answering: `/hang` blocks its event loop for good."""

import os
import time

from modelmux import serve


@serve.deployment(health_check_period_s=0.5, health_check_timeout_s=1, graceful_shutdown_timeout_s=1)
class Hanger:
    async def __call__(self, request):
        if request.url.path.endswith("/hang"):
            time.sleep(600)  # blocks the worker's event loop: health checks go unanswered
        return {"pid": os.getpid()}


app = Hanger.bind()

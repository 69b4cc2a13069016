"""Records, when imported, what this process sees of MODELMUX_ADMIN_TOKEN: a line
`<pid> <the token, or -> <inspect|worker>` in the file MODELMUX_TEST_ENV_RECORD names. The
server's inspection of the application imports it, and so does each worker."""

import os
import sys

from modelmux import serve

_record = os.environ.get("MODELMUX_TEST_ENV_RECORD")
if _record:
    with open(_record, "a") as f:
        role = "inspect" if "--inspect" in sys.argv else "worker"
        f.write(f"{os.getpid()} {os.environ.get('MODELMUX_ADMIN_TOKEN', '-')} {role}\n")


@serve.deployment
class Plain:
    async def __call__(self, request):
        return "ok"


app = Plain.bind()

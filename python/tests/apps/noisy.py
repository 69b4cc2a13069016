"""Prints while being imported (inspect's JSON must stay clean)."""

import os

from modelmux import serve

print("hello from an import")
os.system("echo and from a subprocess")


@serve.deployment
class Quiet:
    def __call__(self):
        return "ok"


app = Quiet.bind()

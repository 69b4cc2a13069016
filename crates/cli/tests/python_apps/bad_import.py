"""Fails at import: the server must stop and say where."""

from modelmux import serve

WEIGHTS = {"a": 1}


def _broken():
    return WEIGHTS["missing"]


_broken()


@serve.deployment
class Never:
    def __call__(self, request):
        return "unreachable"


app = Never.bind()

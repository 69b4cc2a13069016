"""Fails while being imported."""

from modelmux import serve

RATIO = 1 / 0


@serve.deployment
class Never:
    pass


app = Never.bind()

"""Two different bound deployments with one name."""

from modelmux import serve


@serve.deployment
class Leaf:
    def __init__(self, n: int):
        self.n = n


@serve.deployment
class Root:
    def __init__(self, a, b):
        pass


app = Root.bind(Leaf.bind(1), Leaf.bind(2))

"""One deployment bound twice, with different arguments: the second is named `Leaf_1`."""

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

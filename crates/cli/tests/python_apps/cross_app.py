"""Two applications: `caller` reaches `adder`'s deployment through Ray's handle look-ups."""

from modelmux import serve


@serve.deployment
class Adder:
    def add(self, x: int) -> int:
        return x + 40

    def __call__(self, request):
        return "adder"


@serve.deployment
class Caller:
    async def __call__(self, request):
        by_name = serve.get_deployment_handle("Adder", app_name="adder")
        ingress = serve.get_app_handle("adder")
        return {"by_name": await by_name.add.remote(1), "ingress": await ingress.add.remote(2)}


adder = Adder.bind()
caller = Caller.bind()

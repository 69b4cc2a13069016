"""Ray's FastAPI ingress: routes declared on the class, served with the replica's instance."""

from fastapi import FastAPI

from modelmux import serve

api = FastAPI()


@serve.deployment
@serve.ingress(api)
class Greeter:
    def __init__(self, greeting: str):
        self.greeting = greeting

    @api.get("/hello/{name}")
    def hello(self, name: str, punctuation: str = "!") -> dict:
        return {"text": f"{self.greeting}, {name}{punctuation}", "model": serve.get_multiplexed_model_id()}


app = Greeter.bind("Bonjour")

"""A deployment option modelmux refuses."""

from modelmux import serve


@serve.deployment(ray_actor_options={"num_gpus": 1})
class Gpu:
    pass


app = Gpu.bind()

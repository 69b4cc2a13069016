"""modelmux's Python demo: Ray Serve's multiplexing example made runnable, with numpy.

One classifier per customer (4 features in, 3 class probabilities out; same shape, different
weights), each in `<models>/<customer>/weights.npy` in a directory or an S3 bucket, behind a
pre-processing deployment that scales the raw features and calls the customer's model through a
handle. The file is Ray Serve code: with `from ray import serve` it runs on Ray unchanged.

    modelmux serve examples/python/config.yaml
    curl -H 'serve_multiplexed_model_id: customer-1' -d '{"features": [[5.1, 3.5, 1.4, 0.2]]}' localhost:8000
"""

import asyncio
import io

import numpy as np
import starlette.requests
from starlette.responses import JSONResponse

from modelmux import serve
from modelmux.serve.handle import DeploymentHandle

# What the customers' models were trained on: features scaled to zero mean and unit variance.
MEAN = np.array([5.8, 3.0, 3.8, 1.2])
SCALE = np.array([0.8, 0.4, 1.8, 0.8])


def read(location: str) -> bytes:
    """The bytes at `location`: a local path, or `s3://bucket/key` (boto3, with the usual
    AWS_* variables; AWS_ENDPOINT_URL for an S3-compatible server)."""
    if location.startswith("s3://"):
        import boto3  # needed only for models in S3

        bucket, key = location[len("s3://") :].split("/", 1)
        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with open(location, "rb") as f:
        return f.read()


class CustomerModel:
    """A softmax classifier: rows 0-3 of `weights` are the matrix, row 4 the bias."""

    def __init__(self, customer: str, weights: np.ndarray):
        self.customer = customer
        self.weights = weights

    @property
    def nbytes(self) -> int:
        return self.weights.nbytes

    def predict(self, features: np.ndarray) -> np.ndarray:
        logits = features @ self.weights[:4] + self.weights[4]
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        return exp / exp.sum(axis=1, keepdims=True)

    def __del__(self):
        print(f"released the model of {self.customer}")


@serve.deployment(num_replicas=2, user_config={"models": "models"})
class Classifier:
    def reconfigure(self, config: dict):
        self.models = config["models"]

    @serve.multiplexed(max_num_models_per_replica=3, size_bytes=lambda model: model.nbytes)
    async def get_model(self, customer: str) -> CustomerModel:
        data = await asyncio.to_thread(read, f"{self.models}/{customer}/weights.npy")
        return CustomerModel(customer, np.load(io.BytesIO(data)))

    async def predict(self, features: list) -> list:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.predict(np.asarray(features, dtype=np.float64)).tolist()

    async def __call__(self, request: starlette.requests.Request):
        return await self.predict((await request.json())["features"])


@serve.deployment
class Preprocess:
    """Scales raw features as the models expect, then asks the customer's model."""

    def __init__(self, classifier: DeploymentHandle):
        self.classifier = classifier

    async def __call__(self, request: starlette.requests.Request):
        customer = serve.get_multiplexed_model_id()
        if not customer:
            return JSONResponse({"error": "name a customer in the serve_multiplexed_model_id header"}, 400)
        features = np.asarray((await request.json())["features"], dtype=np.float64)
        if features.ndim != 2 or features.shape[1] != 4:
            return JSONResponse({"error": f"features must be N rows of 4, got shape {list(features.shape)}"}, 400)
        scaled = ((features - MEAN) / SCALE).tolist()
        handle = self.classifier.options(multiplexed_model_id=customer)
        probabilities = await handle.predict.remote(scaled)
        return {"customer": customer, "probabilities": probabilities}


app = Preprocess.bind(Classifier.bind())

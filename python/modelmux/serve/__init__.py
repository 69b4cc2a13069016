"""Ray Serve's API on modelmux: `from modelmux import serve` in place of `from ray import serve`.

The modelmux server (Rust) keeps ingress, routing, queues and each replica's model cache;
each replica of a deployment is a Python worker process running the user's class.
"""

from modelmux._api.batching import batch
from modelmux._api.context import (
    ReplicaContext,
    get_multiplexed_model_id,
    get_replica_context,
)
from modelmux._api.deployment import Application, Deployment, deployment
from modelmux._api.handle import (
    DeploymentHandle,
    DeploymentResponse,
    DeploymentResponseGenerator,
)
from modelmux._api.ingress import ingress
from modelmux._api.multiplex import multiplexed
from modelmux._api.runner import (
    delete,
    get_app_handle,
    get_deployment_handle,
    run,
    shutdown,
    start,
    status,
)
from modelmux.serve import exceptions, handle

__all__ = [
    "Application",
    "Deployment",
    "DeploymentHandle",
    "DeploymentResponse",
    "DeploymentResponseGenerator",
    "ReplicaContext",
    "batch",
    "delete",
    "deployment",
    "exceptions",
    "get_app_handle",
    "get_deployment_handle",
    "get_multiplexed_model_id",
    "get_replica_context",
    "handle",
    "ingress",
    "multiplexed",
    "run",
    "shutdown",
    "start",
    "status",
]

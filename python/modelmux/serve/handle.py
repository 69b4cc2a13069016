"""`from modelmux.serve.handle import DeploymentHandle` (Ray's `ray.serve.handle`)."""

from modelmux._api.handle import (
    DeploymentHandle,
    DeploymentResponse,
    DeploymentResponseGenerator,
)

__all__ = ["DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator"]

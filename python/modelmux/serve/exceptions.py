"""Exceptions of `modelmux.serve` (Ray's `ray.serve.exceptions`)."""

from modelmux._api.exceptions import (
    BatchSizeMismatchError,
    DeploymentUnavailableError,
    ModelLoadError,
    RayServeException,
    RequestCancelledError,
)

__all__ = [
    "BatchSizeMismatchError",
    "DeploymentUnavailableError",
    "ModelLoadError",
    "RayServeException",
    "RequestCancelledError",
]

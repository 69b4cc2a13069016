"""Exceptions of `modelmux.serve`, named as Ray Serve's."""

from __future__ import annotations


class RayServeException(Exception):
    """The base of modelmux.serve's own errors (Ray's name, so `except` clauses carry over)."""


class DeploymentUnavailableError(RayServeException):
    """A handle call could not be delivered: no such deployment, overloaded, or the callee's
    replica died. `error_type`, `message` and `status` are the server's."""

    def __init__(self, error_type: str, message: str, status: int | None = None) -> None:
        super().__init__(error_type, message, status)
        self.error_type = error_type
        self.message = message
        self.status = status

    def __str__(self) -> str:
        status = f" (status {self.status})" if self.status is not None else ""
        return f"{self.error_type}: {self.message}{status}"


class ModelLoadError(RayServeException):
    """The server could not load a multiplexed model that a request asked for."""

    def __init__(self, model_id: str, error_type: str, message: str) -> None:
        super().__init__(model_id, error_type, message)
        self.model_id = model_id
        self.error_type = error_type
        self.message = message

    def __str__(self) -> str:
        return f"loading model '{self.model_id}' failed: {self.error_type}: {self.message}"


class BatchSizeMismatchError(RayServeException):
    """A `@serve.batch` function returned a number of results other than its batch size."""


class RequestCancelledError(RayServeException):
    """The call was cancelled (`DeploymentResponseGenerator.cancel()`): its items stop, and
    the callee's generator is cancelled."""


class NoSuchMethodError(RayServeException, AttributeError):
    """A handle call named a method its deployment does not have: Ray's `RayServeException`
    (naming the methods there are), and an `AttributeError`, which the attribute look-up
    would have raised."""

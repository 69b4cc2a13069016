"""`@serve.ingress(app)`: a deployment whose HTTP requests go to an ASGI app (FastAPI or
Starlette). FastAPI routes defined on the class's methods are bound to the replica's
instance, as Ray's class-based views."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

_ATTR = "__modelmux_ingress__"


async def _servable_object() -> Any:
    """The replica's instance (a FastAPI dependency standing for `self`)."""
    from modelmux._api.context import get_replica_context

    return get_replica_context().servable_object


def _is_fastapi(app: Any) -> bool:
    return any(c.__module__.startswith("fastapi") for c in type(app).__mro__)


def _bind_class_routes(app: Any, cls: type) -> None:
    """Rebuilds, in place, the app's routes whose endpoints are `cls`'s functions, so that
    `self` is the replica's instance (a dependency), not a request parameter."""
    from fastapi import Depends
    from fastapi.routing import APIRoute

    settings = [p for p in inspect.signature(APIRoute.__init__).parameters if p != "self"]
    methods = set(vars(cls).values())
    routes = app.router.routes
    for i, route in enumerate(routes):
        if not (isinstance(route, APIRoute) and route.endpoint in methods):
            continue
        signature = inspect.signature(route.endpoint)
        params = list(signature.parameters.values())
        if not params:
            raise TypeError(
                f"{cls.__name__}.{route.endpoint.__name__}: a method routed by FastAPI in a "
                "deployment class must take `self` first"
            )
        this = params[0].replace(default=Depends(_servable_object))
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[1:]]
        # A function's `__signature__` is what inspect.signature (and so FastAPI) reads; typeshed
        # types `endpoint` as a Callable, which declares no such attribute.
        endpoint: Any = route.endpoint
        endpoint.__signature__ = signature.replace(parameters=[this, *rest])
        routes[i] = APIRoute(
            **{name: getattr(route, name) for name in settings if hasattr(route, name)}
        )


def ingress(app: Any) -> Callable[[type], type]:
    """Sends the decorated deployment class's HTTP requests to the ASGI `app`.

    With FastAPI, routes declared on the class's methods (`@app.get("/")` in the class
    body) get the replica's instance as `self`.
    """
    if not callable(app):
        raise TypeError(
            f"serve.ingress() takes an ASGI application (FastAPI, Starlette), not {app!r}"
        )

    def decorate(cls: type) -> type:
        if not inspect.isclass(cls):
            raise TypeError("@serve.ingress(app) decorates a class (below @serve.deployment)")
        if _is_fastapi(app):
            _bind_class_routes(app, cls)
        setattr(cls, _ATTR, app)
        return cls

    return decorate


def ingress_app(cls: type) -> Any | None:
    """The ASGI app the class was decorated with, if any."""
    return getattr(cls, _ATTR, None)

"""`@serve.deployment`, `Deployment` and `Application` (a bound deployment)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from modelmux._api.multiplex import find_multiplexed
from modelmux._api.options import check_options, normalized


class Deployment:
    """A deployment: the user's class and the options given to it.

    `bind(*args, **kwargs)` gives an `Application` (the arguments for the class's constructor;
    bound deployments among them become handles in the replica); `options(...)` gives a copy
    with options changed.
    """

    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        self._cls = cls
        self._options = dict(options)

    @property
    def func_or_class(self) -> type:
        """The user's class."""
        return self._cls

    @property
    def name(self) -> str:
        """The `name` option, else the class name."""
        name: str = self._options.get("name", self._cls.__name__)
        return name

    @property
    def version(self) -> str | None:
        """The `version` option (recorded only)."""
        return self._options.get("version")

    @property
    def user_options(self) -> dict[str, Any]:
        """The options the user set (name and version included), and only those."""
        return dict(self._options)

    def options(self, **options: Any) -> Deployment:
        """A copy with these options set over the current ones (the same checks apply)."""
        check_options(options)
        merged = {**self._options, **options}
        # A new fixed count replaces inherited autoscaling, and new autoscaling an inherited
        # fixed count (as Ray's `options` does).
        if isinstance(options.get("num_replicas"), int) and "autoscaling_config" not in options:
            merged.pop("autoscaling_config", None)
        if options.get("autoscaling_config") is not None and "num_replicas" not in options:
            if isinstance(merged.get("num_replicas"), int):
                merged.pop("num_replicas")
        return Deployment(self._cls, normalized(merged))

    def bind(self, *args: Any, **kwargs: Any) -> Application:
        """The deployment with its constructor's arguments: an application's node."""
        find_multiplexed(self._cls)
        return Application(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"deployment {self.name} cannot be constructed directly: use {self.name}.bind(...) "
            "and serve.run(...)"
        )

    def __repr__(self) -> str:
        return f"Deployment(name={self.name!r}, options={self._options!r})"


class Application:
    """A bound deployment (`Deployment.bind(...)`), the root or a node of an application."""

    def __init__(self, deployment: Deployment, args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.deployment = deployment
        self.args = args
        self.kwargs = kwargs
        # Set when the application binds the same deployment again under its name: the graph
        # names this node `<name>_1`, `<name>_2`, ... (as Ray does).
        self.renamed: str | None = None

    @property
    def name(self) -> str:
        """The deployment's name in its application."""
        return getattr(self, "renamed", None) or self.deployment.name

    def __repr__(self) -> str:
        return f"Application({self.name})"


def deployment(_cls: type | None = None, /, **options: Any) -> Any:
    """Makes a class a deployment, as Ray's `@serve.deployment` (bare or with options).

    Options: `name`, `num_replicas` (int >= 1, or "auto"), `autoscaling_config` (Ray's
    keys, a dict or Ray's `AutoscalingConfig`), `max_ongoing_requests`,
    `max_queued_requests`, `user_config`, `health_check_period_s`,
    `health_check_timeout_s`, `graceful_shutdown_timeout_s`, `version` (recorded only).
    Ray's other options (`ray_actor_options`, ...) raise TypeError.
    """
    check_options(options)
    options = normalized(options)

    def decorate(cls: type) -> Deployment:
        if not inspect.isclass(cls):
            raise TypeError(
                f"@serve.deployment decorates a class; modelmux does not support function "
                f"deployments ({cls!r})"
            )
        return Deployment(cls, options)

    decorator: Callable[[type], Deployment] = decorate
    return decorator if _cls is None else decorator(_cls)

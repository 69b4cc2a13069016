"""The deployment options modelmux accepts, their checks, and the Ray options it refuses."""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable
from typing import Any

_RAY_ONLY = frozenset(
    {
        "ray_actor_options",
        "autoscaling_config",
        "placement_group_bundles",
        "placement_group_strategy",
        "max_replicas_per_node",
        "logging_config",
        "request_router_config",
        "graceful_shutdown_wait_loop_s",
        "route_prefix",
        "max_concurrent_queries",
        "is_driver_deployment",
        "prev_version",
        "init_args",
        "init_kwargs",
        "_internal",
    }
)
"""Options of Ray's `@serve.deployment` that modelmux does not support."""


def _int_at_least(low: int) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"deployment option '{name}' must be an int, got {value!r}")
        if value < low:
            raise ValueError(f"deployment option '{name}' must be at least {low}, got {value}")

    return check


def _seconds(zero_ok: bool) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"deployment option '{name}' must be a number of seconds, got {value!r}"
            )
        if value < 0 or (value == 0 and not zero_ok):
            bound = "at least 0" if zero_ok else "positive"
            raise ValueError(f"deployment option '{name}' must be {bound}, got {value}")

    return check


def _max_queued(name: str, value: Any) -> None:
    _int_at_least(-1)(name, value)
    if value == 0:
        raise ValueError(f"deployment option '{name}' must be -1 (no limit) or positive, got 0")


def _num_replicas(name: str, value: Any) -> None:
    if value == "auto":
        raise TypeError(
            "modelmux does not support the deployment option num_replicas='auto' "
            "(autoscaling): give a number of replicas"
        )
    _int_at_least(1)(name, value)


def _json(name: str, value: Any) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"deployment option '{name}' must be JSON-serializable: {e}") from None


def _str(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"deployment option '{name}' must be a non-empty string, got {value!r}")


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "name": _str,
    "version": _str,
    "num_replicas": _num_replicas,
    "max_ongoing_requests": _int_at_least(1),
    "max_queued_requests": _max_queued,
    "user_config": _json,
    "health_check_period_s": _seconds(zero_ok=False),
    "health_check_timeout_s": _seconds(zero_ok=False),
    "graceful_shutdown_timeout_s": _seconds(zero_ok=True),
}

SERVER_OPTIONS = (
    "num_replicas",
    "max_ongoing_requests",
    "max_queued_requests",
    "user_config",
    "health_check_period_s",
    "health_check_timeout_s",
    "graceful_shutdown_timeout_s",
)
"""The options the server applies (reported by `--inspect`); `name` and `version` are not."""


def check_options(options: dict[str, Any]) -> None:
    """Raises TypeError/ValueError naming the first option modelmux refuses."""
    for name, value in options.items():
        if name in _RAY_ONLY:
            raise TypeError(f"modelmux does not support the deployment option '{name}'")
        check = _CHECKS.get(name)
        if check is None:
            raise TypeError(f"'{name}' is not a deployment option")
        check(name, value)

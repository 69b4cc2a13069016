"""The deployment options modelmux accepts, their checks, and the Ray options it refuses."""

from __future__ import annotations

import json
import numbers
from collections.abc import Callable
from typing import Any

_RAY_ONLY = frozenset(
    {
        "ray_actor_options",
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
    if value == "auto" or value is None:
        return
    _int_at_least(1)(name, value)


_AUTOSCALING_KEYS = frozenset(
    {
        "min_replicas",
        "max_replicas",
        "initial_replicas",
        "target_ongoing_requests",
        "upscale_delay_s",
        "downscale_delay_s",
        "downscale_to_zero_delay_s",
        "upscaling_factor",
        "downscaling_factor",
        "smoothing_factor",
        "upscale_smoothing_factor",
        "downscale_smoothing_factor",
        "metrics_interval_s",
        "look_back_period_s",
        "aggregation_function",
    }
)
"""Ray's `autoscaling_config` keys (its custom `policy` is not supported)."""


def _autoscaling_config(name: str, value: Any) -> None:
    if value is None:
        return
    if hasattr(value, "model_dump"):  # Ray's AutoscalingConfig object
        value = value.model_dump(exclude_unset=True)
    if not isinstance(value, dict):
        raise TypeError(f"deployment option '{name}' must be a dict, got {value!r}")
    for key, v in value.items():
        if key not in _AUTOSCALING_KEYS:
            raise TypeError(f"'{key}' is not an autoscaling_config key modelmux supports")
        if key == "aggregation_function":
            if str(v).lower() not in ("mean", "max", "min"):
                raise ValueError(f"autoscaling_config.{key} must be mean, max or min, got {v!r}")
        elif v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise TypeError(f"autoscaling_config.{key} must be a number, got {v!r}")
    # The server checks them together (min <= initial <= max, ...) as it checks the YAML's.


def check_scaling(options: dict[str, Any]) -> None:
    """Ray's rule: a fixed `num_replicas` and an `autoscaling_config` together are refused."""
    n = options.get("num_replicas")
    if options.get("autoscaling_config") is not None and n not in (None, "auto"):
        raise ValueError(
            "Manually setting num_replicas is not allowed when autoscaling_config is provided."
        )


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
    "autoscaling_config": _autoscaling_config,
    "max_ongoing_requests": _int_at_least(1),
    "max_queued_requests": _max_queued,
    "user_config": _json,
    "health_check_period_s": _seconds(zero_ok=False),
    "health_check_timeout_s": _seconds(zero_ok=False),
    "graceful_shutdown_timeout_s": _seconds(zero_ok=True),
}

SERVER_OPTIONS = (
    "num_replicas",
    "autoscaling_config",
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
    check_scaling(options)


def normalized(options: dict[str, Any]) -> dict[str, Any]:
    """The options as the server reads them: Ray's `AutoscalingConfig` object as its dict."""
    value = options.get("autoscaling_config")
    if value is not None and hasattr(value, "model_dump"):
        return {**options, "autoscaling_config": value.model_dump(exclude_unset=True)}
    return options

"""`serve.status()`: what the server reports of the applications it serves."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from modelmux._api import client


@dataclass
class DeploymentStatus:
    """A deployment: `HEALTHY` when a replica takes requests, else `UNHEALTHY`."""

    name: str
    status: str
    replica_states: dict[str, int]
    message: str = ""


@dataclass
class ApplicationStatus:
    """An application: `RUNNING` when all its deployments are healthy, else `UNHEALTHY`."""

    name: str
    status: str
    route_prefix: str
    deployments: dict[str, DeploymentStatus]
    message: str = ""


@dataclass
class ServeStatus:
    """Every application the server serves, by name."""

    applications: dict[str, ApplicationStatus] = field(default_factory=dict)


def _deployment(entry: dict[str, Any]) -> DeploymentStatus:
    replicas = entry.get("replicas", [])
    available = sum(1 for r in replicas if r.get("available"))
    states = {"RUNNING": available, "UNAVAILABLE": len(replicas) - available}
    healthy = available > 0
    return DeploymentStatus(
        name=entry["name"],
        status="HEALTHY" if healthy else "UNHEALTHY",
        replica_states={k: v for k, v in states.items() if v},
        message="" if healthy else "no replica is taking requests",
    )


def read_status() -> ServeStatus:
    """Reads `GET /-/routes` and `GET /-/models` of the server this process started."""
    routes = client.request("GET", "/-/routes")
    models = client.request("GET", "/-/models")
    for result in (routes, models):
        if result.status != 200:
            error_type, message = client.error_message(result)
            raise RuntimeError(f"the server answered {result.status}: {error_type}: {message}")
    prefixes = {app: prefix for prefix, app in json.loads(routes.body).items()}
    status = ServeStatus()
    for app in json.loads(models.body).get("applications", []):
        deployments = {d["name"]: _deployment(d) for d in app.get("deployments", [])}
        healthy = all(d.status == "HEALTHY" for d in deployments.values())
        status.applications[app["name"]] = ApplicationStatus(
            name=app["name"],
            status="RUNNING" if healthy else "UNHEALTHY",
            route_prefix=prefixes.get(app["name"], app.get("route_prefix", "")),
            deployments=deployments,
            message="" if healthy else "a deployment has no replica taking requests",
        )
    return status

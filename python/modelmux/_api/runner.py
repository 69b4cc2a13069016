"""`serve.start`, `serve.run`, `serve.delete`, `serve.status`, `serve.shutdown` and the
handle look-ups: a driver script running applications on a modelmux server it starts."""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any

from modelmux._api import client, context
from modelmux._api.deployment import Application, Deployment
from modelmux._api.graph import deployments_of
from modelmux._api.handle import DeploymentHandle
from modelmux._api.server import AppEntry, ServerProcess
from modelmux._api.status import ServeStatus, read_status

_lock = threading.RLock()
_http_options: dict[str, Any] = {"host": "127.0.0.1", "port": 8000}
_apps: dict[str, AppEntry] = {}
_server: ServerProcess | None = None
_atexit_registered = False


def start(http_options: dict[str, Any] | None = None, **unknown: Any) -> None:
    """Sets where the server listens (`{"host": ..., "port": ...}`; default 127.0.0.1:8000).

    The server itself starts with the first `serve.run`; a running one restarts on the new
    address.
    """
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise TypeError(f"serve.start() got unsupported argument(s) {names}")
    options = dict(http_options or {})
    extra = set(options) - {"host", "port"}
    if extra:
        raise TypeError(f"modelmux supports http_options host and port only, not {sorted(extra)}")
    port = options.get("port", 0)
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError("http_options['port'] must be an int")
    if "host" in options and not isinstance(options["host"], str):
        raise TypeError("http_options['host'] must be a str")
    with _lock:
        changed = {**_http_options, **options} != _http_options
        _http_options.update(options)
        if changed and _server is not None:
            _restart()


def _stop() -> None:
    global _server
    server, _server = _server, None
    client.set_endpoint(None)
    if server is not None:
        server.stop()


def _restart() -> None:
    global _server, _atexit_registered
    _stop()
    if not _apps:
        return
    server = ServerProcess(_http_options["host"], _http_options["port"], dict(_apps))
    server.start()
    _server = server
    client.set_endpoint(client.Endpoint(server.base_url, server.token, server.alive))
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True


def run(
    target: Application,
    blocking: bool = False,
    name: str = "default",
    route_prefix: str = "/",
    **unknown: Any,
) -> DeploymentHandle:
    """Serves the application `target` as `name` at `route_prefix`; returns its ingress's handle.

    Starts the modelmux server in the background (stdout and stderr go to this process's),
    and waits until it serves the application. Running an application that runs already
    replaces its replicas, as Ray does: this returns once the old ones have shut down (their
    models unloaded, `__del__` run); the other applications keep their replicas and models.
    Running another application restarts the server with all of them (their models are
    loaded again). `blocking=True` waits until Ctrl-C, then shuts down.
    """
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise TypeError(f"serve.run() got unsupported argument(s) {names}")
    if isinstance(target, Deployment):
        raise TypeError(
            f"serve.run() takes an application: bind the deployment ({target.name}.bind())"
        )
    if not isinstance(target, Application):
        raise TypeError(f"serve.run() takes an application (Cls.bind(...)), not {target!r}")
    if not isinstance(route_prefix, str) or not route_prefix.startswith("/"):
        raise ValueError(f"route_prefix must be a str starting with '/', got {route_prefix!r}")
    deployments_of(target)
    with _lock:
        for other, entry in _apps.items():
            if other != name and entry.route_prefix == route_prefix:
                raise ValueError(
                    f"application '{other}' already serves route prefix {route_prefix}"
                )
        previous = _apps.get(name)
        _apps[name] = AppEntry(target, route_prefix)
        try:
            # An application that runs already is replaced in place, as in Ray (its old
            # replicas shut down, their models unloaded; the other applications keep theirs).
            if not (
                _server is not None
                and _server.serves(_apps)
                and _server.redeploy(dict(_apps), name)
            ):
                _restart()
        except BaseException:
            if previous is None:
                del _apps[name]
            else:
                _apps[name] = previous
            raise
        server = _server
    handle = DeploymentHandle(target.name, name)
    if blocking:
        _block(server)
    return handle


def _block(server: ServerProcess | None) -> None:
    try:
        while server is not None and server.exit_code() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        shutdown()
        return
    if server is not None:
        raise RuntimeError(f"the modelmux server exited with status {server.exit_code()}")


def delete(name: str) -> None:
    """Stops serving the application `name` (the server restarts with the others)."""
    with _lock:
        if _apps.pop(name, None) is not None:
            _restart()


def status() -> ServeStatus:
    """The applications the server this process started serves, and their deployments."""
    with _lock:
        if _server is None:
            return ServeStatus()
    return read_status()


def shutdown() -> None:
    """Stops the server (SIGTERM, SIGKILL after 30 s) and forgets every application."""
    with _lock:
        _apps.clear()
        _stop()


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """A handle to a deployment: of this replica's application (or `app_name`) inside a
    replica; of a served application (`app_name`, else the only one or "default") in a driver."""
    rt = context.runtime()
    if rt is not None:
        own_app = app_name in (None, rt.app_name)
        return DeploymentHandle(deployment_name, None if own_app else app_name)
    with _lock:
        client.endpoint()
        if app_name is None:
            app_name = next(iter(_apps)) if len(_apps) == 1 else "default"
        entry = _apps.get(app_name)
        if entry is None:
            raise ValueError(f"no application named '{app_name}' is running")
        if deployment_name not in deployments_of(entry.app):
            raise ValueError(f"application '{app_name}' has no deployment '{deployment_name}'")
    return DeploymentHandle(deployment_name, app_name)


def get_app_handle(name: str) -> DeploymentHandle:
    """A handle to the ingress deployment of the application `name`."""
    rt = context.runtime()
    if rt is not None:
        if name != rt.app_name:
            # The server knows the other application's ingress: no deployment named.
            return DeploymentHandle("", name)
        return DeploymentHandle(rt.ingress_name())
    with _lock:
        entry = _apps.get(name)
        if entry is None:
            raise ValueError(f"no application named '{name}' is running")
    return DeploymentHandle(entry.app.name, name)

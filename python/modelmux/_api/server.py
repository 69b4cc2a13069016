"""The modelmux server process `serve.run` starts: its configuration, start, readiness wait
and stop."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import modelmux
from modelmux._api import client, serialization
from modelmux._api.deployment import Application
from modelmux._binary import find_binary

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


@dataclass
class AppEntry:
    """A served application: its root bound deployment and route prefix."""

    app: Application
    route_prefix: str


def _normalize(prefix: str) -> str:
    return prefix.rstrip("/") or "/"


def _pythonpath() -> str:
    """PYTHONPATH for the workers: the current directory, the script's directory, this
    package's parent (unless it is a site directory), then the inherited PYTHONPATH."""
    entries = [os.getcwd()]
    if sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0]):
        entries.append(os.path.dirname(os.path.abspath(sys.argv[0])))
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(modelmux.__file__)))
    site_dirs = {os.path.abspath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if package_parent not in site_dirs:
        entries.append(package_parent)
    inherited = os.environ.get("PYTHONPATH")
    if inherited:
        entries.extend(inherited.split(os.pathsep))
    return os.pathsep.join(dict.fromkeys(e for e in entries if e))


class ServerProcess:
    """One run of the server binary over a private temporary directory."""

    def __init__(self, host: str, port: int, apps: dict[str, AppEntry]) -> None:
        self.host = host
        self.port = port
        self.token = secrets.token_urlsafe(32)
        connect_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        if ":" in connect_host:
            connect_host = f"[{connect_host}]"
        self.base_url = f"http://{connect_host}:{port}"
        self._dir = tempfile.mkdtemp(prefix="modelmux-serve-")
        self._apps = apps
        self._proc: subprocess.Popen[bytes] | None = None
        # Each application's pickle; a redeployed application's gets a new name, so the
        # server sees that it changed (and only it).
        self._pickles: dict[str, str] = {}
        self._version = 0
        # Set when something answered on the port without proving it is this server.
        self._foreign: str | None = None

    def serves(self, apps: dict[str, AppEntry]) -> bool:
        """Whether this server runs the same applications (names and route prefixes) as
        `apps`, so that a change of their code can be deployed to it without a restart."""
        return [(n, _normalize(e.route_prefix)) for n, e in self._apps.items()] == [
            (n, _normalize(e.route_prefix)) for n, e in apps.items()
        ]

    def redeploy(self, apps: dict[str, AppEntry], name: str) -> bool:
        """Deploys `apps` (the same applications, `name`'s with new code) to the running
        server: `name`'s replicas are replaced, and this returns once the old ones have shut
        down (their models unloaded). False when the server refuses the change (it needs a
        restart); nothing changed then."""
        if not self.alive():
            raise RuntimeError(f"the modelmux server exited with status {self.exit_code()}")
        running, pickles = self._apps, dict(self._pickles)
        self._apps = apps
        self._pickles.pop(name, None)
        config = self._write_config()
        with open(config, encoding="utf-8") as f:
            body = json.dumps({"config": f.read()}).encode()
        answer = client.request(
            "POST",
            "/-/deploy",
            body=body,
            headers={"content-type": "application/json"},
            base_url=self.base_url,
            token=self.token,
            timeout=START_TIMEOUT_S + STOP_TIMEOUT_S,
        )
        if answer.status != 200:
            self._apps, self._pickles = running, pickles
            if answer.status == 400:
                return False
            raise RuntimeError(
                f"the modelmux server did not take the new application ({answer.status}): "
                f"{answer.body.decode(errors='replace')}"
            )
        self._wait_ready()
        return True

    def _write_config(self) -> str:
        applications = []
        for i, (name, entry) in enumerate(self._apps.items()):
            path = self._pickles.get(name)
            if path is None:
                self._version += 1
                path = os.path.join(self._dir, f"app-{i}-v{self._version}.pkl")
                with open(path, "wb") as f:
                    f.write(serialization.dumps_application(entry.app))
                self._pickles[name] = path
            applications.append(
                {"name": name, "route_prefix": entry.route_prefix, "import_path": f"pickle:{path}"}
            )
        config: dict[str, Any] = {
            "http_options": {"host": self.host, "port": self.port, "admin_token": self.token},
            "applications": applications,
        }
        path = os.path.join(self._dir, "config.yaml")
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
        return path

    def start(self) -> None:
        """Starts the server and waits (at most `START_TIMEOUT_S`) until it serves every
        application; stops it and raises RuntimeError when it does not."""
        try:
            binary = find_binary()
            config = self._write_config()
            env = {**os.environ, "MODELMUX_PYTHON": sys.executable, "PYTHONPATH": _pythonpath()}
            self._proc = subprocess.Popen([binary, "serve", config], env=env)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        """Healthy, serving every application, and ours: the first answer, asked without the
        token, must prove that the server holds it (a process that took the port cannot), and
        only then is the token sent."""

        def get(path: str, send_token: bool = True) -> client.HttpResult:
            return client.request(
                "GET",
                path,
                base_url=self.base_url,
                token=self.token,
                send_token=send_token,
                timeout=2,
            )

        try:
            if get("/-/healthz", send_token=False).status != 200:
                return False
            if get("/-/models").status != 200:
                return False
            served = {_normalize(p): a for p, a in json.loads(get("/-/routes").body).items()}
        except client.ForeignServerError as e:
            self._foreign = str(e)
            return False
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return False
        return all(
            served.get(_normalize(entry.route_prefix)) == name for name, entry in self._apps.items()
        )

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        pause = 0.05
        # The process first: whatever answers on the port is not trusted once it has exited.
        while (code := self._proc.poll()) is not None or not self._ready():
            if code is not None:
                raise RuntimeError(
                    f"the modelmux server exited with status {code} before it was ready "
                    f"(its log is above){self._foreign_note()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the modelmux server was not ready within {START_TIMEOUT_S:.0f} s "
                    f"at {self.base_url}{self._foreign_note()}"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _foreign_note(self) -> str:
        if self._foreign is None:
            return ""
        return (
            f"; another process answers on {self.base_url} without proving that it is this "
            "server (is the port taken?): nothing it sent was read, and it was never sent "
            "the admin token"
        )

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The server's exit status once it has exited, else None."""
        return None if self._proc is None else self._proc.poll()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `STOP_TIMEOUT_S`; removes the temporary directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

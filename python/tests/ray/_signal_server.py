"""The test process's side of `_ray_shim.SignalActor`: the signals themselves (each as Ray's
SignalActor actor, an asyncio.Event and a count of waiters), served over HTTP on 127.0.0.1 by a
threaded server started on first use. Each call is `POST /<signal id>/<method>` with the JSON
`{"args": [...], "kwargs": {...}}`; the answer is `{"result": ...}` once the method returns (a
`wait` answers when the signal is sent), or `{"error": ...}`.

Kept apart from _ray_shim.py, which travels by value to the replicas: this module (its server,
its locks) stays in the test process.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Signals:
    """The test process's signals (each as Ray's SignalActor: an asyncio.Event and a count of
    waiters), served over HTTP on 127.0.0.1."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        signals = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("content-length") or 0)
                call = json.loads(self.rfile.read(length) or b"{}")
                try:
                    _, sid, method = self.path.split("/")
                    result = signals.call(int(sid), method, *call["args"], **call["kwargs"])
                    status, body = 200, {"result": result}
                except Exception as e:  # an unknown method or signal: the caller raises it
                    status, body = 400, {"error": f"{type(e).__name__}: {e}"}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(
            target=self._httpd.serve_forever, name="signal-actors", daemon=True
        ).start()

    def new(self) -> int:
        with self._cond:
            sid = next(self._ids)
            self._state[sid] = {"set": False, "generation": 0, "waiters": 0}
            return sid

    def call(self, sid: int, method: str, *args: Any, **kwargs: Any) -> Any:
        state = self._state[sid]
        if method == "send":
            return self._send(state, *args, **kwargs)
        if method == "wait":
            return self._wait(state, *args, **kwargs)
        if method == "cur_num_waiters":
            with self._cond:
                return state["waiters"]
        raise AttributeError(f"SignalActor has no method {method!r}")

    def _send(self, state: dict[str, Any], clear: bool = False) -> None:
        # Ray's: `self.ready_event.set(); if clear: self.ready_event.clear()`; the waiters
        # woken by the set return even when it is cleared at once.
        with self._cond:
            state["set"] = True
            state["generation"] += 1
            self._cond.notify_all()
            if clear:
                state["set"] = False

    def _wait(self, state: dict[str, Any], should_wait: bool = True) -> None:
        if not should_wait:
            return
        with self._cond:
            state["waiters"] += 1
            generation = state["generation"]
            while not state["set"] and state["generation"] == generation:
                self._cond.wait()
            state["waiters"] -= 1


_signals: _Signals | None = None
_signals_lock = threading.Lock()


def signal_server() -> _Signals:
    """The test process's signal server (started on first use)."""
    global _signals
    with _signals_lock:
        if _signals is None:
            _signals = _Signals()
        return _signals

"""A fake Rust peer: listens on a Unix socket, starts a real worker process with a spec, and
speaks the worker protocol to it (framing written here independently of modelmux's)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from dataclasses import dataclass
from typing import Any

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPS_DIR = os.path.join(PYTHON_DIR, "tests", "apps")

REQUEST, REQUEST_BODY, REQUEST_END, CANCEL, CONTROL, CALL_RESULT = 1, 2, 3, 4, 5, 7
CALL_RESULT_BODY, CALL_RESULT_END = 8, 9
READY, FATAL, START, BODY, END, ERROR, REPLY, CALL, ACQUIRE = 16, 17, 18, 19, 20, 21, 22, 23, 24
CALL_BODY, CALL_END, CALL_CANCEL = 25, 26, 27


def worker_env(**extra: str) -> dict[str, str]:
    """The environment for a worker or inspection subprocess: modelmux importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PYTHON_DIR, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


@dataclass
class Frame:
    type: int
    stream: int
    head: dict[str, Any] | None
    data: bytes


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    frames: list[Frame]


def encode(type_: int, stream: int, head: dict[str, Any] | None, data: bytes) -> bytes:
    head_bytes = json.dumps(head).encode() if head is not None else b""
    return (
        struct.pack(">I", 9 + len(head_bytes) + len(data))
        + bytes([type_])
        + struct.pack(">II", stream, len(head_bytes))
        + head_bytes
        + data
    )


class Peer:
    """One worker process and its socket."""

    def __init__(
        self,
        app_source: str,
        deployment: str,
        *,
        user_config: Any = None,
        working_dir: str | None = APPS_DIR,
        app_name: str = "default",
        replica_id: str | None = None,
        accept: bool = True,
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="modelmux-peer-")
        self.out_dir = os.path.join(self.dir, "out")
        os.mkdir(self.out_dir)
        path = os.path.join(self.dir, "worker.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self._listener.settimeout(60)
        spec = {
            "socket": path,
            "app_source": app_source,
            "working_dir": working_dir,
            "app_name": app_name,
            "deployment": deployment,
            "replica_id": replica_id or f"{deployment}#test1",
            "user_config": user_config,
        }
        self.log_path = os.path.join(self.dir, "worker.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "modelmux._worker", "--spec", json.dumps(spec)],
            env=worker_env(MODELMUX_TEST_OUT=self.out_dir),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._frames: list[Frame] = []
        self._cond = threading.Condition()
        self._closed = False
        self.sock: socket.socket | None = None
        self._write_lock = threading.Lock()
        if accept:
            self.accept()

    def accept(self) -> None:
        """Accepts the worker's connection and starts reading its frames."""
        self.sock, _ = self._listener.accept()
        threading.Thread(target=self._read, daemon=True).start()

    def _recv_exact(self, n: int) -> bytes:
        if self.sock is None:
            raise AssertionError("the worker has not connected")
        parts = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise EOFError
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def _read(self) -> None:
        try:
            while True:
                (length,) = struct.unpack(">I", self._recv_exact(4))
                rest = self._recv_exact(length)
                type_ = rest[0]
                stream, head_len = struct.unpack(">II", rest[1:9])
                head = json.loads(rest[9 : 9 + head_len]) if head_len else None
                with self._cond:
                    self._frames.append(Frame(type_, stream, head, rest[9 + head_len :]))
                    self._cond.notify_all()
        except (EOFError, OSError):
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def log(self) -> str:
        """What the worker printed so far."""
        self._log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def send(
        self, type_: int, stream: int, head: dict[str, Any] | None = None, data: bytes = b""
    ) -> None:
        if self.sock is None:
            raise AssertionError("the worker has not connected")
        with self._write_lock:
            self.sock.sendall(encode(type_, stream, head, data))

    def next(
        self,
        type_: int | tuple[int, ...] | None = None,
        stream: int | None = None,
        timeout: float = 15,
    ) -> Frame:
        """Takes the first frame received of this type (or one of these types) and/or stream
        (waiting for it)."""
        types = type_ if isinstance(type_, tuple) else (type_,)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, f in enumerate(self._frames):
                    if (type_ is None or f.type in types) and stream in (None, f.stream):
                        return self._frames.pop(i)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    raise AssertionError(
                        f"no frame type={type_} stream={stream} within {timeout} s; "
                        f"pending {[(f.type, f.stream) for f in self._frames]}\n{self.log()}"
                    )
                self._cond.wait(remaining)

    def frames_for(self, stream: int, wait: float) -> list[Frame]:
        """Waits `wait` seconds and takes the frames of `stream` received meanwhile."""
        time.sleep(wait)
        return self._take(stream)

    def frames_after_barrier(self, stream: int, barrier: int) -> list[Frame]:
        """The frames of `stream` received by the time a request sent now on stream `barrier`
        is answered: whatever the worker sent for `stream` in answer to the frames before it
        has come by then (a negative check that waits for the worker, not for a clock)."""
        reply = self.get(barrier, "/")
        if reply.status != 200:
            raise AssertionError(f"the barrier request got {reply.status}")
        return self._take(stream)

    def _take(self, stream: int) -> list[Frame]:
        with self._cond:
            mine = [f for f in self._frames if f.stream == stream]
            self._frames = [f for f in self._frames if f.stream != stream]
        return mine

    def request(
        self,
        stream: int,
        path: str = "/",
        *,
        method: str = "GET",
        body: bytes = b"",
        headers: list[list[str]] | None = None,
        model_id: str | None = None,
        call: str | None = None,
        streamed: bool = False,
        more: bool = False,
        query: str = "",
        root_path: str = "",
    ) -> None:
        head = {
            "method": method,
            "scheme": "http",
            "path": path,
            "query_string": query,
            "root_path": root_path,
            "headers": headers or [],
            "client": ["127.0.0.1", 40000],
            "http_version": "1.1",
            "model_id": model_id,
            "request_id": f"req-{stream}",
            "call": call,
            "more": more,
            **({"stream": True} if streamed else {}),
        }
        self.send(REQUEST, stream, head, body)

    def response(self, stream: int, timeout: float = 15) -> Response:
        """Collects a response: START (+ BODY* + END); an ERROR raises AssertionError.

        Only a response's frame types are taken: the worker numbers its own calls' streams
        independently of the requests', so a call frame left over from an earlier test (a
        `CALL_CANCEL` sent when a caller stopped before the answer's end) may carry the same
        stream number."""
        first = self.next((START, ERROR), stream=stream, timeout=timeout)
        if first.type == ERROR:
            raise AssertionError(f"ERROR on stream {stream}: {first.head}")
        if first.type != START or first.head is None:
            raise AssertionError(f"a response starts with START and a head, not {first}")
        frames = [first]
        body = [first.data]
        if first.head["more"]:
            while True:
                f = self.next((BODY, END, ERROR), stream=stream, timeout=timeout)
                frames.append(f)
                if f.type == END:
                    break
                if f.type != BODY:
                    raise AssertionError(f"BODY or END expected, not {f}")
                body.append(f.data)
        headers = {k: v for k, v in first.head["headers"]}
        return Response(first.head["status"], headers, b"".join(body), frames)

    def get(self, stream: int, path: str = "/", **kwargs: Any) -> Response:
        self.request(stream, path, **kwargs)
        return self.response(stream)

    def control(self, stream: int, head: dict[str, Any], timeout: float = 15) -> dict[str, Any]:
        """Sends a CONTROL and returns its REPLY's head."""
        self.send(CONTROL, stream, head)
        reply = self.next(REPLY, stream, timeout=timeout)
        if reply.head is None:
            raise AssertionError(f"a REPLY without a head: {reply}")
        return reply.head

    def out_file(self, name: str) -> str:
        """The contents of a file the test app wrote in its out directory ("" when none)."""
        try:
            with open(os.path.join(self.out_dir, name)) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def close(self) -> int:
        """Closes the socket (as Rust ends a worker); returns the worker's exit status."""
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        self._listener.close()
        try:
            code = self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
            shutil.rmtree(self.dir, ignore_errors=True)
        return code


class WorkerTestCase(unittest.TestCase):
    """A test class sharing one worker: `APP` and `DEPLOYMENT` (and `PEER_OPTIONS`) say which;
    it starts before the first test (its READY kept as `ready`) and must exit with 0 after the
    last. `next_stream()` numbers requests from `FIRST_STREAM + 1`."""

    APP: str
    DEPLOYMENT: str
    PEER_OPTIONS: dict[str, Any] = {}
    FIRST_STREAM = 0

    @classmethod
    def setUpClass(cls):
        cls.peer = Peer(cls.APP, cls.DEPLOYMENT, **cls.PEER_OPTIONS)
        cls.ready = cls.peer.next(READY)
        cls.stream = cls.FIRST_STREAM

    @classmethod
    def tearDownClass(cls):
        code = cls.peer.close()
        if code != 0:
            raise AssertionError(f"worker exited with {code}")

    def next_stream(self) -> int:
        type(self).stream += 1
        return type(self).stream

"""A process that holds the driver's port before its server does (security review T5-01).

It answers readiness as the real server does and hands out a pickle whose `__reduce__` makes a
file. `serve.run` must refuse it with a clear error, unpickle nothing it sends, and never send
it the admin token; a handle call must never unpickle an answer that does not prove it comes
from the server the driver started, even when the listener changes after the start.
"""

import json
import os
import pickle
import stat
import sys
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from modelmux import serve
from modelmux._api import client
from modelmux._api.handle import DeploymentHandle
from tests.peer import PYTHON_DIR

FAKE_SERVER = os.path.join(PYTHON_DIR, "tests", "fake_server.py")
REPO = Path(__file__).resolve().parents[2]


def executable(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


@serve.deployment
class App:
    def echo(self, *args):
        return args


class MakesAFile:
    """Unpickling it creates `path` (what a hostile pickle could do, harmlessly)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class ForeignServer:
    """An `http.server` on 127.0.0.1 that answers like modelmux: healthy, serving "/" as
    "default", any token accepted, every POST answered with a pickle (and a made-up proof).
    Records every request it gets."""

    def __init__(self, mark: str) -> None:
        self.requests: list[dict] = []
        pickled = pickle.dumps(MakesAFile(mark))
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def answer(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("content-type", content_type)
                self.send_header("x-modelmux-result", "value")
                self.send_header("x-modelmux-proof", "0" * 64)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def record(self) -> bytes:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
                return body

            def do_GET(self) -> None:
                self.record()
                if self.path == "/-/routes":
                    self.answer(json.dumps({"/": "default"}).encode(), "application/json")
                elif self.path == "/-/models":
                    self.answer(b'{"applications": []}', "application/json")
                else:
                    self.answer(b'{"status": "ok"}', "application/json")

            def do_POST(self) -> None:
                self.record()
                self.answer(pickled, "application/x-python-pickle")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def saw(self, secret: str) -> bool:
        """Whether any request carried `secret` (in a header or the body)."""
        return any(
            secret in json.dumps(r["headers"]) or secret.encode() in r["body"]
            for r in self.requests
        )

    def authorization_headers(self) -> list[str]:
        return [
            v for r in self.requests for k, v in r["headers"].items() if k.lower() == "authorization"
        ]


class ForeignServerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.mark = os.path.join(self.dir.name, "unpickled-the-foreign-answer")
        self.foreign = ForeignServer(self.mark)
        self.record = os.path.join(self.dir.name, "record.jsonl")
        names = ("MODELMUX_BIN", "MODELMUX_FAKE_RECORD")
        self.saved = {k: os.environ.get(k) for k in names}
        serve.start(http_options={"host": "127.0.0.1", "port": self.foreign.port})

    def tearDown(self):
        serve.shutdown()
        client.set_endpoint(None)
        self.foreign.close()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.dir.cleanup()

    def use_stand_in_server(self) -> None:
        """`serve.run` starts tests/fake_server.py, which proves it holds the token as the
        real server does (and, as it, fails to bind a port that is taken)."""
        binary = executable(
            os.path.join(self.dir.name, "modelmux"),
            f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SERVER}" "$@"\n',
        )
        os.environ.update(MODELMUX_BIN=binary, MODELMUX_FAKE_RECORD=self.record)

    def assert_refused(self) -> None:
        with self.assertRaises(RuntimeError) as ctx:
            serve.run(App.bind())
        message = str(ctx.exception)
        self.assertIn("exited with status", message)
        self.assertIn(f"another process answers on {self.foreign.url}", message)
        self.assertIn("nothing it sent was read", message)
        self.assertTrue(self.foreign.requests, "the foreign server was never asked")
        # A handle call after the refused start goes nowhere.
        with self.assertRaisesRegex(RuntimeError, r"serve\.run"):
            DeploymentHandle("App", "default").echo.remote(1).result(timeout_s=10)
        self.assertFalse(os.path.exists(self.mark), "the foreign pickle was unpickled")
        self.assertEqual(self.foreign.authorization_headers(), [])

    def test_run_refuses_a_foreign_server_on_its_port_and_never_sends_it_the_token(self):
        self.use_stand_in_server()
        self.assert_refused()
        with open(self.record) as f:
            [record] = [json.loads(line) for line in f]
        self.assertFalse(self.foreign.saw(record["config"]["http_options"]["admin_token"]))

    def test_the_real_server_is_refused_the_foreign_port_and_the_driver_says_why(self):
        binary = REPO / "target" / "debug" / "modelmux"
        if not binary.exists():
            self.skipTest(f"no {binary} (cargo build --bin modelmux)")
        os.environ["MODELMUX_BIN"] = str(binary)
        self.assert_refused()

    def test_a_handle_call_never_unpickles_an_answer_without_the_servers_proof(self):
        # The listener changed after the start (the server died and another process took
        # its port, unnoticed): the answer does not prove it holds the token.
        client.set_endpoint(client.Endpoint(self.foreign.url, "the-drivers-token", lambda: True))
        with self.assertRaises(client.ForeignServerError) as ctx:
            DeploymentHandle("App", "default").echo.remote(1).result(timeout_s=10)
        self.assertIn("without proving that it is the modelmux server", str(ctx.exception))
        self.assertIn("its answer was not read", str(ctx.exception))
        self.assertEqual(len(self.foreign.requests), 1)
        self.assertFalse(os.path.exists(self.mark), "the foreign pickle was unpickled")

    def test_a_handle_call_asks_nothing_once_the_server_process_has_exited(self):
        client.set_endpoint(client.Endpoint(self.foreign.url, "the-drivers-token", lambda: False))
        with self.assertRaisesRegex(RuntimeError, "has exited"):
            DeploymentHandle("App", "default").echo.remote(1).result(timeout_s=10)
        self.assertEqual(self.foreign.requests, [])
        self.assertFalse(self.foreign.saw("the-drivers-token"))


class ProofTest(unittest.TestCase):
    def test_the_proof_is_the_rust_sides(self):
        # The value crates/serve/src/identity.rs's test pins for the same token and nonce.
        self.assertEqual(
            client.proof("s3cret", "nonce-0123456789abcdef"),
            "5c635c3ada0b7d96056a32578d55c3374f2df1b6e6eb64c4ee7a6ebd42f6a647",
        )


if __name__ == "__main__":
    unittest.main()

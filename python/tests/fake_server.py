"""A stand-in for the Rust server binary in the driver tests (`modelmux serve <config>`):
serves the admin endpoints and the handle-call endpoint `serve.run`'s handles use (proving
that it holds the admin token, as the real one does), and records what it was started with."""

import hashlib
import hmac
import json
import os
import pickle
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cloudpickle


def proof(token: str, nonce: str) -> str:
    """HMAC-SHA256 of the nonce keyed by the token, as `modelmux_serve::identity_proof`."""
    message = b"modelmux-proof-v1\n" + nonce.encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def main() -> None:
    if os.environ.get("MODELMUX_FAKE_MODE") == "exit3":
        sys.exit(3)
    if sys.argv[1] != "serve":
        raise SystemExit(f"the fake server serves only: {sys.argv}")
    with open(sys.argv[2]) as f:
        config = json.load(f)
    apps = {}
    for app in config["applications"]:
        kind, path = app["import_path"].split(":", 1)
        if kind != "pickle":
            raise SystemExit(f"the fake server takes pickled applications, not {kind}")
        with open(path, "rb") as f:
            apps[app["name"]] = cloudpickle.load(f)
    with open(os.environ["MODELMUX_FAKE_RECORD"], "a") as f:
        record = {
            "argv": sys.argv[1:],
            "pid": os.getpid(),
            "config": config,
            "ingress": {name: app.name for name, app in apps.items()},
            "env": {k: os.environ.get(k) for k in ("MODELMUX_PYTHON", "PYTHONPATH")},
        }
        f.write(json.dumps(record) + "\n")
    token = config["http_options"]["admin_token"]
    routes = {a["route_prefix"]: a["name"] for a in config["applications"]}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def reply(self, status: int, body: bytes, headers: dict | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {"content-type": "application/json"}).items():
                self.send_header(k, v)
            # As the real admin API: the proof that this server holds the token.
            nonce = self.headers.get("x-modelmux-nonce")
            if nonce:
                self.send_header("x-modelmux-proof", proof(token, nonce))
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def authorized(self) -> bool:
            if self.headers.get("authorization") == f"Bearer {token}":
                return True
            self.reply(401, b'{"error": {"type": "unauthorized", "message": "no token"}}')
            return False

        def do_GET(self) -> None:
            if self.path == "/-/healthz":
                self.reply(200, b'{"status": "ok"}')
            elif self.path == "/-/routes":
                self.reply(200, json.dumps(routes).encode())
            elif self.path == "/-/models" and self.authorized():
                listing = {
                    "applications": [
                        {
                            "name": name,
                            "route_prefix": prefix,
                            "deployments": [
                                {
                                    "name": apps[name].name,
                                    "queued_requests": 0,
                                    "replicas": [
                                        {"id": "r#1", "available": True, "loaded": [], "loading": []}
                                    ],
                                }
                            ],
                        }
                        for prefix, name in routes.items()
                    ]
                }
                self.reply(200, json.dumps(listing).encode())

        def do_POST(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            parts = url.path.split("/")  # ['', '-', 'deployments', d, 'call', m]
            if not self.authorized():
                return
            if self.headers["content-type"] != "application/x-python-pickle":
                raise AssertionError(f"a call of content type {self.headers['content-type']}")
            args, kwargs = pickle.loads(self.rfile.read(int(self.headers["content-length"])))
            deployment, method = parts[3], parts[5]
            app = urllib.parse.parse_qs(url.query)["app"][0]
            if method == "echo":
                value = {
                    "deployment": deployment,
                    "app": app,
                    "args": args,
                    "kwargs": kwargs,
                    "model_id": self.headers.get("serve_multiplexed_model_id"),
                }
                self.reply(200, pickle.dumps(value), {"x-modelmux-result": "value"})
            elif method == "boom":
                error = pickle.dumps(ValueError("boom from fake"))
                self.reply(500, error, {"x-modelmux-result": "exception"})
            else:
                error = {"error": {"type": "not_found", "message": f"no method {method}"}}
                self.reply(404, json.dumps(error).encode())

    http = config["http_options"]
    server = ThreadingHTTPServer((http["host"], http["port"]), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()

"""The driver's side of handle calls and admin reads: HTTP to the server `serve.run` started.

Every request carries a fresh nonce, and every answer must prove that it comes from a server
holding this driver's admin token (`x-modelmux-proof`: HMAC-SHA256 of the nonce keyed by the
token) before anything of it is read: a process that took the port cannot feed the driver a
pickle. The token itself goes only to a server that has proved it holds it (`serve.run`'s
readiness check asks without it first), and only while the server process still runs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="modelmux-handle")


NONCE_HEADER = "x-modelmux-nonce"
PROOF_HEADER = "x-modelmux-proof"


class ForeignServerError(RuntimeError):
    """An answer that did not prove it came from the server this process started (another
    process may hold its port): nothing of it was read."""


def proof(token: str, nonce: str) -> str:
    """What the server answers to `nonce` to prove it holds `token` (as the Rust side's
    `modelmux_serve::identity_proof`)."""
    message = b"modelmux-proof-v1\n" + nonce.encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens, the admin token it was given, and whether its process still
    runs (None: not known)."""

    base_url: str
    token: str
    alive: Callable[[], bool] | None = None


_endpoint: Endpoint | None = None


def set_endpoint(endpoint: Endpoint | None) -> None:
    """Records (or forgets) the server this process started."""
    global _endpoint
    _endpoint = endpoint


def endpoint() -> Endpoint:
    """The server this process started; RuntimeError when there is none."""
    if _endpoint is None:
        raise RuntimeError(
            "no modelmux server is running in this process: call serve.run(...) first"
        )
    return _endpoint


def submit(fn: Callable[..., T], *args: Any) -> Future[T]:
    """Runs `fn(*args)` on the handle calls' thread pool."""
    return _executor.submit(fn, *args)


@dataclass(frozen=True)
class HttpResult:
    """A response: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


def request(
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    base_url: str | None = None,
    token: str | None = None,
    send_token: bool = True,
    timeout: float | None = None,
) -> HttpResult:
    """One HTTP request to the server (any status is a result, not an exception).

    With a token, the answer must prove that the server holds it, else `ForeignServerError`
    is raised before its body is read; the token is sent only with `send_token`. A server
    process known to have exited is not asked (RuntimeError).
    """
    target = endpoint() if base_url is None else Endpoint(base_url, token or "")
    if target.alive is not None and not target.alive():
        raise RuntimeError(
            "the modelmux server this process started has exited: call serve.run(...) again"
        )
    all_headers = dict(headers or {})
    nonce = secrets.token_urlsafe(24)
    if target.token:
        all_headers[NONCE_HEADER] = nonce
        if send_token:
            all_headers["authorization"] = f"Bearer {target.token}"
    req = urllib.request.Request(
        target.base_url + path, data=body, headers=all_headers, method=method
    )
    try:
        with _opener.open(req, timeout=timeout) as resp:
            _check_proof(target, nonce, resp.headers, method, path)
            return HttpResult(resp.status, _lower(resp.headers.items()), resp.read())
    except urllib.error.HTTPError as e:
        with e:
            _check_proof(target, nonce, e.headers, method, path)
            return HttpResult(e.code, _lower(e.headers.items()), e.read())


def _check_proof(target: Endpoint, nonce: str, headers: Any, method: str, path: str) -> None:
    if not target.token:
        return
    given = (headers.get(PROOF_HEADER) if headers is not None else None) or ""
    if not hmac.compare_digest(given.encode(), proof(target.token, nonce).encode()):
        raise ForeignServerError(
            f"{target.base_url} answered {method} {path.split('?')[0]} without proving that it "
            "is the modelmux server this process started (another process may hold the "
            "port): its answer was not read"
        )


def _lower(items: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def call_path(deployment: str, method: str, app: str) -> str:
    """The path of the server's handle-call endpoint."""
    quote = urllib.parse.quote
    return (
        f"/-/deployments/{quote(deployment, safe='')}/call/{quote(method, safe='')}"
        f"?app={quote(app, safe='')}"
    )


def error_message(result: HttpResult) -> tuple[str, str]:
    """The error type and message of an error response (the server's JSON, else the text)."""
    try:
        error = json.loads(result.body)["error"]
        return str(error.get("type", "error")), str(error.get("message", error))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "error", result.body.decode("utf-8", "replace").strip() or f"HTTP {result.status}"

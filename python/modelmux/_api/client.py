"""The driver's side of handle calls and admin reads: HTTP to the server `serve.run` started."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="modelmux-handle")


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens and the admin token it was given."""

    base_url: str
    token: str


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
    timeout: float | None = None,
) -> HttpResult:
    """One HTTP request to the server (any status is a result, not an exception)."""
    target = endpoint() if base_url is None else Endpoint(base_url, token or "")
    all_headers = dict(headers or {})
    if target.token:
        all_headers["authorization"] = f"Bearer {target.token}"
    req = urllib.request.Request(
        target.base_url + path, data=body, headers=all_headers, method=method
    )
    try:
        with _opener.open(req, timeout=timeout) as resp:
            return HttpResult(resp.status, _lower(resp.headers.items()), resp.read())
    except urllib.error.HTTPError as e:
        with e:
            return HttpResult(e.code, _lower(e.headers.items()), e.read())


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

"""Fixtures of Ray Serve's tests ported to modelmux (test_*.py here; the Ray-private helpers they
use are in _ray_shim.py).

Ray's `serve_instance` (python/ray/serve/tests/conftest.py) starts a Ray cluster and Serve once
per module and deletes every application after each test. Here `serve_instance` sets Serve's
default address (`serve.start()`; modelmux's server itself starts with the first `serve.run`, on
127.0.0.1:8000, as Ray's tests expect) and calls `serve.shutdown()` after each test, which stops
the server and forgets every application. `serve_instance_async` is the same for async tests.

The server binary is $MODELMUX_BIN, else target/debug/modelmux of this checkout
(`cargo build --bin modelmux`): without one every test fails; none is ever skipped.

Each test's call has a time limit (`TIME_LIMIT_S`, or `@pytest.mark.time_limit(seconds)`): past
it the test fails with `TestTimeLimitExceeded` (SIGALRM in the main thread), so a call that
would hang fails instead (teardown's `serve.shutdown()` still waits for requests in flight).

The replicas are worker processes that unpickle the applications: the test modules' own
classes and functions (those at module level too, such as test_handle_streaming.py's
`AsyncStreamer`) are registered with cloudpickle to travel by value, as classes of a driver
script's `__main__` do, since a worker cannot import a test module by its pytest name.
"""

import os
import signal
import sys
from pathlib import Path

import cloudpickle
import pytest
import pytest_asyncio

from modelmux import serve

REPO = Path(__file__).resolve().parents[3]
TIME_LIMIT_S = 60.0


class TestTimeLimitExceeded(Exception):
    """A test's call ran past its time limit."""

    __test__ = False  # not a test class


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "time_limit(seconds): fail the test's call once it has run this long"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("time_limit")
    limit = float(marker.args[0]) if marker else TIME_LIMIT_S

    def expired(signum, frame):
        raise TestTimeLimitExceeded(f"{item.nodeid} ran past its time limit of {limit:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _check_binary() -> None:
    binary = Path(os.environ.get("MODELMUX_BIN") or REPO / "target" / "debug" / "modelmux")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(
            f"no modelmux binary at {binary}: `cargo build --bin modelmux`, or set $MODELMUX_BIN",
            pytrace=False,
        )
    os.environ.setdefault("MODELMUX_BIN", str(binary))


def pytest_collection_finish(session):
    for module in {item.module for item in session.items if getattr(item, "module", None)}:
        if module.__name__ in sys.modules:
            cloudpickle.register_pickle_by_value(module)


@pytest.fixture
def serve_instance():
    _check_binary()
    serve.start()
    try:
        yield
    finally:
        serve.shutdown()


@pytest_asyncio.fixture
async def serve_instance_async():
    _check_binary()
    serve.start()
    try:
        yield
    finally:
        serve.shutdown()

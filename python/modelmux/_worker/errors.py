"""Describing user errors: where they happened (`file:line`) and the protocol's error object."""

from __future__ import annotations

import os
import sysconfig
import traceback
from typing import Any

import modelmux
from modelmux._worker.app_loader import WHERE_ATTR

_PACKAGE_DIR = os.path.dirname(os.path.abspath(modelmux.__file__)) + os.sep
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p) + os.sep
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)


def _is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_PACKAGE_DIR) and not path.startswith(_LIBRARY_DIRS)


def location(exc: BaseException, origin: tuple[str, int] | None = None) -> str:
    """`file:line` of the error: where the loader placed it (a syntax error: its own file
    and line); else the innermost traceback frame in the user's files; else `origin` (the
    application's definition); else the outermost frame."""
    where = getattr(exc, WHERE_ATTR, None)
    if where is None and isinstance(exc, SyntaxError) and exc.filename:
        where = (exc.filename, exc.lineno or 0)
    if where is None:
        frames = traceback.extract_tb(exc.__traceback__)
        user = [f for f in frames if _is_user_file(f.filename)]
        if user:
            where = (user[-1].filename, user[-1].lineno)
        elif origin is not None:
            where = origin
        elif frames:
            where = (frames[0].filename, frames[0].lineno)
    return f"{where[0]}:{where[1]}" if where is not None else "<unknown>:0"


def summary(exc: BaseException, origin: tuple[str, int] | None = None) -> str:
    """`file:line: Type: message`."""
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return f"{location(exc, origin)}: {type(exc).__name__}: {message}"


def describe(exc: BaseException) -> dict[str, Any]:
    """The protocol's error object: type, message, traceback."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }

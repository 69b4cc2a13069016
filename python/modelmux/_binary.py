"""Finding the modelmux server binary (never on PATH: the console script has its name)."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


class BinaryNotFoundError(RuntimeError):
    """No modelmux server binary was found."""


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_binary() -> str:
    """The server binary: `$MODELMUX_BIN`; else `modelmux/_bin/modelmux` in this package (a
    wheel's); else, in a checkout, `target/release/modelmux` then `target/debug/modelmux`."""
    env = os.environ.get("MODELMUX_BIN")
    if env:
        if not _runnable(Path(env)):
            raise BinaryNotFoundError(f"MODELMUX_BIN={env} is not an executable file")
        return env
    repo = _PACKAGE.parent.parent
    candidates = [
        _PACKAGE / "_bin" / "modelmux",
        repo / "target" / "release" / "modelmux",
        repo / "target" / "debug" / "modelmux",
    ]
    for path in candidates:
        if _runnable(path):
            return str(path)
    tried = ", ".join(str(p) for p in candidates)
    raise BinaryNotFoundError(
        "the modelmux server binary was not found (tried "
        f"{tried}): set MODELMUX_BIN to its path, build it in the modelmux checkout "
        "(cargo build --release), or install a modelmux wheel that contains it"
    )

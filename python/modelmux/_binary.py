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
    if (repo / "Cargo.toml").is_file():
        # An editable install in a checkout whose binary is not built yet.
        fix = f"build it: cargo build --release (in {repo}), or set MODELMUX_BIN to its path"
    else:
        # `pip install ./python` copies the Python package alone, away from any checkout.
        fix = (
            "this modelmux package was installed without it (`pip install ./python` copies the "
            "Python package only). Install the wheel that carries it instead: in a modelmux "
            "checkout run scripts/build-python-wheel, then pip install target/wheels/modelmux-*.whl; "
            "or install the checkout editable (pip install -e ./python) and build the binary "
            "there (cargo build --release); or set MODELMUX_BIN to the binary's path"
        )
    raise BinaryNotFoundError(f"the modelmux server binary was not found (tried {tried}): {fix}")

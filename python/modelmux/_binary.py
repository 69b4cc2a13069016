"""Finding the modelmux server binary: where the wheel installs it (the environment's scripts
directory, as ruff's and uv's wheels install theirs), or, in a checkout, the one built there."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_NAME = "modelmux" + (sysconfig.get_config_var("EXE") or "")


class BinaryNotFoundError(RuntimeError):
    """No modelmux server binary was found."""


def checkout() -> Path | None:
    """The modelmux checkout this package is imported from (its python/modelmux), if it is."""
    repo = _PACKAGE.parent.parent
    if (repo / "Cargo.toml").is_file() and (repo / "crates" / "cli" / "Cargo.toml").is_file():
        return repo
    return None


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _scripts_dirs() -> list[Path]:
    """Where pip puts a wheel's scripts for this package: this environment's scripts directory
    (a virtualenv's bin/), the user scheme's (`pip install --user`), and bin/ beside the
    package's root (`pip install --target DIR`)."""
    dirs = [sysconfig.get_path("scripts")]
    if not sys.flags.no_user_site:
        dirs.append(sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user")))
    found = [Path(d) for d in dirs if d]
    found.append(_PACKAGE.parent / "bin")
    return found


def candidates() -> list[Path]:
    """The places `find_binary` looks, in order: in a checkout, its `target/release` then
    `target/debug` build (the binary of the same source as this Python code); then the
    scripts directories a wheel installs into."""
    places: list[Path] = []
    repo = checkout()
    if repo is not None:
        places += [repo / "target" / "release" / _NAME, repo / "target" / "debug" / _NAME]
    places += [d / _NAME for d in _scripts_dirs()]
    return list(dict.fromkeys(places))


def find_binary() -> str:
    """The server binary: `$MODELMUX_BIN`, else the first runnable one of `candidates()`."""
    env = os.environ.get("MODELMUX_BIN")
    if env:
        if not _runnable(Path(env)):
            raise BinaryNotFoundError(f"MODELMUX_BIN={env} is not an executable file")
        return env
    places = candidates()
    for path in places:
        if _runnable(path):
            return str(path)
    tried = ", ".join(str(p) for p in places)
    repo = checkout()
    if repo is not None:
        # A checkout whose binary is not built yet.
        fix = f"build it: cargo build --release (in {repo}), or set MODELMUX_BIN to its path"
    else:
        # The package's files alone (copied, or on PYTHONPATH), without the wheel's scripts.
        fix = (
            "this modelmux package was not installed from its wheel, which puts the binary in "
            "the environment's scripts directory. In a modelmux checkout, build the wheel "
            "(scripts/build-python-wheel) and pip install target/wheels/modelmux-*.whl, or "
            "pip install ./python (or pip install -e ./python), which builds the binary with "
            "maturin and cargo; or set MODELMUX_BIN to the binary's path"
        )
    raise BinaryNotFoundError(f"the modelmux server binary was not found (tried {tried}): {fix}")

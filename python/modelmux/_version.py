"""The package's version: the Cargo workspace's, one version for the binary and the package.

The wheel's metadata carries it (maturin takes it from Cargo); a checkout reads it from the
workspace's Cargo.toml, which is where both come from."""

from __future__ import annotations

import importlib.metadata
import tomllib

from modelmux._binary import checkout


def version() -> str:
    """The workspace's `[workspace.package] version` in a checkout, else the installed
    distribution's."""
    repo = checkout()
    if repo is not None:
        with (repo / "Cargo.toml").open("rb") as f:
            return str(tomllib.load(f)["workspace"]["package"]["version"])
    try:
        return importlib.metadata.version("modelmux")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"

"""The `modelmux` console script: runs the server binary with the same arguments."""

from __future__ import annotations

import os
import sys

from modelmux._binary import BinaryNotFoundError, find_binary


def main() -> None:
    """Execs the server binary, telling it to start workers with this Python."""
    try:
        binary = find_binary()
    except BinaryNotFoundError as e:
        print(f"modelmux: {e}", file=sys.stderr)
        sys.exit(127)
    os.environ["MODELMUX_PYTHON"] = sys.executable
    os.execv(binary, [binary, *sys.argv[1:]])

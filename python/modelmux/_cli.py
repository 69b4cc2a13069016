"""`python -m modelmux`: runs the server binary with the same arguments, its workers on this
Python (the wheel's `modelmux` command is the binary itself, whose workers run on
`$MODELMUX_PYTHON`, else the `python3` on PATH)."""

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

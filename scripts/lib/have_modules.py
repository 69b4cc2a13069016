"""Exits 0 when every module named imports in this interpreter, 1 otherwise (silently): the
scripts' check that a virtualenv has what they need before they reinstall it.

Usage: PYTHON scripts/lib/have_modules.py MODULE...   (say: moto.server onnx numpy)"""

import importlib
import sys


def main(names: list[str]) -> int:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            return 1
    return 0


if __name__ == "__main__":
    # This directory is first on sys.path when the file runs: take it off, so that none of
    # its modules stands in for a package being checked.
    del sys.path[0]
    sys.exit(main(sys.argv[1:]))

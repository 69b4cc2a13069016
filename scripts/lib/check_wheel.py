"""Checks the wheel scripts/test builds (maturin, `bindings = "bin"`).

  check_wheel.py WHEEL AUDITWHEEL_SHOW_OUTPUT
      the wheel is tagged manylinux, with the tag `auditwheel show` found it consistent with;
      it holds the package (with py.typed) and the server binary in its scripts, and its
      version is the Cargo workspace's
  check_wheel.py --installed WHEEL   (run on the Python of a virtualenv the wheel is installed
                                      in, away from any checkout, that virtualenv's bin/ first
                                      on PATH)
      `modelmux --help` runs the binary; `python -m modelmux --help` too; the package says the
      wheel's version and finds the binary in the environment's scripts directory"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def wheel_tags(path: str) -> tuple[str, str, str]:
    """(name, version, platform tag) from a wheel's file name."""
    name, version, _python, _abi, platform = os.path.basename(path)[: -len(".whl")].split("-")
    return name, version, platform


def auditwheel_tag(report: str) -> str | None:
    """The platform tag `auditwheel show` says the wheel is consistent with (its lines wrap)."""
    m = re.search(r'consistent with the following platform tag:\s*"([^"]+)"', " ".join(report.split()))
    return m.group(1) if m else None


def problems(names: list[str], version: str, platform: str, audited: str | None,
             cargo_version: str) -> list[str]:
    """What is wrong with a wheel of these members, version and tags."""
    out = []
    if not re.fullmatch(r"manylinux_\d+_\d+_\w+", platform):
        out.append(f"the wheel is tagged {platform}, not manylinux_X_Y_ARCH")
    if audited is None:
        out.append("auditwheel did not name a platform tag the wheel is consistent with")
    elif audited != platform:
        out.append(f"auditwheel finds it consistent with {audited}, but it is tagged {platform}")
    if version != cargo_version:
        out.append(f"the wheel's version is {version}, the Cargo workspace's {cargo_version}")
    want = ["modelmux/__init__.py", "modelmux/py.typed", "modelmux/_worker/__main__.py",
            f"modelmux-{version}.data/scripts/modelmux"]
    out += [f"the wheel lacks {w}" for w in want if w not in names]
    stray = [n for n in names if n.startswith(("tests/", "typings/")) or n.endswith((".pyc", "setup.py"))]
    out += [f"the wheel holds {n}" for n in stray]
    return out


def cargo_version() -> str:
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        version: str = tomllib.load(f)["workspace"]["package"]["version"]
        return version


def check_built(wheel: str, report_path: str) -> list[str]:
    _, version, platform = wheel_tags(wheel)
    with open(report_path) as f:
        audited = auditwheel_tag(f.read())
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    found = problems(names, version, platform, audited, cargo_version())
    if not found:
        print(f"check_wheel: {os.path.basename(wheel)}: {platform}, as auditwheel finds it; "
              f"{len(names)} files, the binary in its scripts; version {version} (Cargo's)")
    return found


def check_installed(wheel: str) -> list[str]:
    _, version, _ = wheel_tags(wheel)
    scripts = os.path.dirname(sys.executable)
    binary = shutil.which("modelmux")
    out = []
    if binary is None or os.path.dirname(binary) != scripts:
        return [f"`modelmux` on PATH is {binary}, not the one in {scripts}"]
    with open(binary, "rb") as f:
        if f.read(4) != b"\x7fELF":
            out.append(f"{binary} is not the server binary (an ELF file)")
    for argv in ([binary, "--help"], [sys.executable, "-m", "modelmux", "--help"]):
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if run.returncode != 0 or "serve" not in run.stdout:
            out.append(f"{' '.join(argv)}: exit {run.returncode}: {run.stdout[-300:]}{run.stderr[-300:]}")
    probe = ("import modelmux, modelmux._binary as b; "
             "print(modelmux.__version__, b.find_binary(), b.checkout())")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    said = run.stdout.split()
    if run.returncode != 0 or said != [version, binary, "None"]:
        out.append(f"the installed package says {run.stdout.strip()!r} {run.stderr[-300:]}"
                   f" (want version {version}, binary {binary}, no checkout)")
    if not out:
        print(f"check_wheel: installed: `modelmux --help` and `python -m modelmux --help` run "
              f"{binary}; modelmux.__version__ {version}")
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--installed"] and len(argv) == 2:
        found = check_installed(argv[1])
    elif len(argv) == 2:
        found = check_built(argv[0], argv[1])
    else:
        sys.exit(__doc__)
    for p in found:
        print(f"check_wheel: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

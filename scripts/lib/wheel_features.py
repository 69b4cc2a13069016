"""The `--features` that make a build of the `modelmux` binary alone (`maturin build -p
modelmux-cli`) resolve the dependencies' features as the workspace's test build did, so that
it reuses that build's artifacts instead of compiling the dependency tree again.

`cargo test --workspace` unifies each dependency's features over every member and their
dev-dependencies (tokio with `test-util`, say); a build of the binary alone would not, and a
dependency built with other features is another artifact, with everything above it. The
difference, for each direct dependency of the binary's crate, is `dependency/feature`, which
cargo accepts on the command line. A difference in an indirect dependency cannot be named
that way: it is reported on stderr, and that part is built again.

Usage: python3 scripts/lib/wheel_features.py [PACKAGE, default modelmux-cli]   (prints the list)
"""

from __future__ import annotations

import re
import subprocess
import sys

_LINE = re.compile(r"^(?P<name>\S+) v\S+(?: \([^)]*\))? \[(?P<features>[^\]]*)\]")


def parse_tree(text: str) -> dict[str, set[str]]:
    """Each package's features from `cargo tree --prefix none -f '{p} [{f}]'` lines."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            features = {f for f in m["features"].split(",") if f}
            out.setdefault(m["name"], set()).update(features)
    return out


def direct_dependencies(text: str) -> set[str]:
    """The names at depth 1 of `cargo tree --depth 1 --prefix depth -f '{p}'` (the package's own
    direct dependencies)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("1"):
            names.add(line[1:].split()[0])
    return names


def missing_features(
    alone: dict[str, set[str]], workspace: dict[str, set[str]], direct: set[str]
) -> tuple[list[str], list[str]]:
    """(`dependency/feature` for each feature the workspace's build enables on a direct
    dependency that the binary's build alone does not; the indirect dependencies whose features
    differ and cannot be named)."""
    named, unreachable = [], []
    for name, features in sorted(alone.items()):
        extra = workspace.get(name, set()) - features
        if not extra:
            continue
        if name in direct:
            named += [f"{name}/{f}" for f in sorted(extra)]
        else:
            unreachable.append(f"{name} ({', '.join(sorted(extra))})")
    return named, unreachable


def _tree(*args: str) -> str:
    cmd = ["cargo", "tree", "--locked", "--prefix", "none", "-f", "{p} [{f}]", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
    package = argv[0] if argv else "modelmux-cli"
    alone = parse_tree(_tree("-p", package, "-e", "normal,build"))
    workspace = parse_tree(_tree("--workspace", "-e", "normal,build,dev"))
    depth = subprocess.run(
        ["cargo", "tree", "--locked", "-p", package, "-e", "normal", "--depth", "1",
         "--prefix", "depth", "-f", "{p}"],
        check=True, capture_output=True, text=True,
    ).stdout
    named, unreachable = missing_features(alone, workspace, direct_dependencies(depth))
    if unreachable:
        print(
            "wheel_features: built again (their features differ and are not direct "
            f"dependencies of {package}): {'; '.join(unreachable)}",
            file=sys.stderr,
        )
    print(",".join(named))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

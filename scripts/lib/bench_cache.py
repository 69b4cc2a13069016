"""scripts/bench-cache's table: each cache benchmark's mean beside the lock-based design's
and the bare mutex map's, from criterion's estimates under target/criterion.

Usage: python3 scripts/lib/bench_cache.py [CRITERION_DIR, default target/criterion]"""

from __future__ import annotations

import json
import os
import sys

CASES = ["one_thread", "two_threads_same_model", "two_threads_one_model_each"]


def mean_ns(criterion: str, group: str, name: str) -> float:
    """Criterion's mean estimate (ns) of `group/name`."""
    with open(os.path.join(criterion, group, name, "new", "estimates.json")) as f:
        mean: float = json.load(f)["mean"]["point_estimate"]
        return mean


def table(mean: dict[tuple[str, str], float]) -> list[str]:
    """The table's lines from the means (ns) by (group, case); the ratio is modelmux's over the
    locked cache's (below 1: modelmux is faster)."""
    lines = [f"{'case':32} {'modelmux':>10} {'locked':>10} {'ratio':>6} {'bare map':>10}"]
    for case in CASES:
        m, lk, b = mean["hit", case], mean["locked_cache", case], mean["bare_mutex_map", case]
        lines.append(f"{'hit/' + case:32} {m:8.1f}ns {lk:8.1f}ns {m / lk:6.2f} {b:8.1f}ns")
    lines.append(f"{'miss/zero_cost_loader':32} {mean['miss', 'zero_cost_loader'] / 1000:8.2f}us")
    return lines


def main(argv: list[str]) -> int:
    criterion = argv[0] if argv else "target/criterion"
    keys = [(g, c) for c in CASES for g in ("hit", "locked_cache", "bare_mutex_map")]
    keys.append(("miss", "zero_cost_loader"))
    print("\n".join(table({k: mean_ns(criterion, *k) for k in keys})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

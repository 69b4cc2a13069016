"""scripts/flood-ids' arithmetic.

  python3 scripts/lib/flood_ids.py requests < BENCH.json     the request count of one round
  python3 scripts/lib/flood_ids.py check START END BOUND SENT
      the verdict: the RSS (MiB) grew from START to END by at most BOUND; exits 1 when not"""

from __future__ import annotations

import json
import sys


def within_bound(start_mib: float, end_mib: float, bound_mib: float) -> bool:
    """Whether the RSS grew by at most the bound (shrinking always passes)."""
    return end_mib - start_mib <= bound_mib


def verdict(start: float, end: float, bound: float, sent: int) -> tuple[bool, str]:
    ok = within_bound(start, end, bound)
    return ok, (
        f"  [{'ok' if ok else 'FAIL'}] {sent} unknown ids: RSS {start:.1f} -> {end:.1f} MiB "
        f"({end - start:+.1f} MiB; at most +{bound:.0f})"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["requests"]:
        print(json.load(sys.stdin)["requests"])
        return 0
    if argv[:1] == ["check"] and len(argv) == 5:
        ok, line = verdict(float(argv[1]), float(argv[2]), float(argv[3]), int(argv[4]))
        print(line)
        return 0 if ok else 1
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""scripts/soak's summary of the steady Zipf traffic (`modelmux bench --json`): exits 1 when a
request went unanswered (a connection error or a timeout).

Usage: python3 scripts/lib/soak_report.py BENCH.json"""

from __future__ import annotations

import json
import sys
from typing import Any


def report(r: dict[str, Any]) -> tuple[bool, list[str]]:
    ok = r["transport_errors"] == 0
    return ok, [
        f"\n== steady Zipf traffic ({r['requests']} requests, {r['requests_per_second']:.0f}/s)",
        f"  answered with an error: {r['failed']} (loads fail 10% of the time); "
        f"p99 {r['latency_ms']['p99']:.0f} ms",
        f"  [{'ok' if ok else 'FAIL'}] no request went unanswered "
        f"({r['transport_errors']} connection errors or timeouts)",
    ]


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        ok, lines = report(json.load(f))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""scripts/bench-structured's table against issue 22's targets, from bench_structured's JSON
lines: constrained decoding at >= 90% of free decode tok/s (1 and 8 streams), one /metrics
scrape <= 1% of the scrape interval. Exits 1 when a target is missed.

Usage: python3 scripts/lib/bench_structured.py RESULTS.jsonl"""

from __future__ import annotations

import sys
from typing import Any

from benchutil import report_targets

CONSTRAINED_TARGET = 0.90
SCRAPE_TARGET = 0.01


def report(rows: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the table's lines, the targets missed)."""
    lines = ["| figure | free | constrained / scraped | ratio | target | |", "|---|---|---|---|---|---|"]
    missed = []
    for n in (1, 8):
        r = rows.get(f"constrained_{n}")
        if r is None:
            missed.append(f"constrained_{n} missing")
            continue
        ok = r["ratio"] >= CONSTRAINED_TARGET
        lines.append(
            f"| decode tok/s, {n} stream{'s' if n > 1 else ''} | {r['free_tok_s']:.1f} | "
            f"{r['constrained_tok_s']:.1f} | {r['ratio']:.3f} | >= 0.90 | {'✓' if ok else '✗'} |"
        )
        if not ok:
            missed.append(f"constrained_{n}: {r['ratio']:.3f} < 0.90")
    s = rows.get("scrape8")
    if s is None:
        missed.append("scrape8 missing")
    else:
        ok = s["scrape_share"] <= SCRAPE_TARGET
        lines.append(
            f"| 8 streams, wall s (scrape every {s['scrape_every_ms']} ms) | {s['wall_s']:.3f} | "
            f"{s['wall_scraped_s']:.3f} | {s['ratio']:.3f} | (noise) | |"
        )
        lines.append(
            f"| one scrape of {s['scrape_bytes']} bytes, ms / interval | | {s['scrape_ms']:.2f} ms | "
            f"{s['scrape_share']:.4f} | <= 0.01 | {'✓' if ok else '✗'} |"
        )
        if not ok:
            missed.append(f"scrape share {s['scrape_share']:.4f} > 0.01")
    return lines, missed


if __name__ == "__main__":
    sys.exit(report_targets(sys.argv[1], report))

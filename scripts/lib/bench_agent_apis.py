"""scripts/bench-agent-apis's table against issue 56's targets, from bench_agent_apis's JSON
lines: /v1/responses and /v1/messages at >= 98% of /v1/chat/completions' tok/s on the same 8
streams (the median of the runs' paired ratios; the interval of that median is shown beside it), and a turn chained by previous_response_id at most 1 ms (p50) over the same turn sent
whole. Exits 1 when a target is missed.

Usage: python3 scripts/lib/bench_agent_apis.py RESULTS.jsonl"""

from __future__ import annotations

import sys
from typing import Any

from benchutil import report_targets

RATIO_TARGET = 0.98
CHAIN_TARGET_MS = 1.0


def report(rows: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(the table's lines, the targets missed)."""
    lines = ["| figure | chat | this API | ratio / added | target | |", "|---|---|---|---|---|---|"]
    missed = []
    s = rows.get("streams8")
    if s is None:
        missed.append("streams8 missing")
    else:
        for api in ("responses", "messages"):
            ratio = s[f"{api}_ratio"]
            ok = ratio >= RATIO_TARGET
            low, high = s.get(f"{api}_ratio_ci", [ratio, ratio])
            lines.append(
                f"| /v1/{api}, 8 streams, tok/s | {s['chat_tok_s']:.1f} | {s[f'{api}_tok_s']:.1f} | "
                f"{ratio:.3f} (95%: {low:.3f}-{high:.3f}) | >= {RATIO_TARGET:.2f} | "
                f"{'✓' if ok else '✗'} |"
            )
            if not ok:
                missed.append(f"{api}: {ratio:.3f} < {RATIO_TARGET:.2f}")
    c = rows.get("chain")
    if c is None:
        missed.append("chain missing")
    else:
        ok = c["added_p50_ms"] <= CHAIN_TARGET_MS
        lines.append(
            f"| a turn, p50 ms (whole input / previous_response_id) | {c['inline_p50_ms']:.2f} | "
            f"{c['chained_p50_ms']:.2f} | {c['added_p50_ms']:+.2f} ms | <= +{CHAIN_TARGET_MS:.0f} ms | "
            f"{'✓' if ok else '✗'} |"
        )
        lines.append(f"| GET /v1/responses/{{id}}, p50 ms | | {c['read_p50_ms']:.2f} | | | |")
        if not ok:
            missed.append(f"chaining adds {c['added_p50_ms']:.2f} ms > {CHAIN_TARGET_MS:.0f} ms")
    return lines, missed


if __name__ == "__main__":
    sys.exit(report_targets(sys.argv[1], report))

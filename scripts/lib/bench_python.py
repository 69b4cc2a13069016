"""scripts/bench-python's Python.

  VENV_PYTHON scripts/lib/bench_python.py bare-rss     (in the directory holding app.py)
      the RSS (KiB) of a bare Python that imported app.py
  python3 scripts/lib/bench_python.py summary RESULTS.jsonl
      the summary: each system's requests/s, p99 and hit ratio, and modelmux's against Ray's
      and uvicorn's"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import sys
from typing import Any

Runs = dict[tuple[str, str], dict[str, Any]]


def bare_rss_kb() -> int:
    # This directory is first on sys.path: the app is imported from the working directory.
    sys.path[0] = os.getcwd()
    importlib.import_module("app")
    with open("/proc/self/status") as f:
        m = re.search(r"VmRSS:\s+(\d+)", f.read())
    assert m is not None
    return int(m.group(1))


def hit_ratio(loads: int, requests: int) -> float:
    """1 - loads / requests (the application counts its loads itself, for every system)."""
    return 1 - loads / max(requests, 1)


def ratio(runs: Runs, a: str, b: str, case: str, key: str) -> float:
    """System a's figure over system b's, for one case."""
    value: float = runs[(a, case)]["bench"][key] / runs[(b, case)]["bench"][key]
    return value


def p99_ratio(runs: Runs, a: str, b: str, case: str) -> float:
    value: float = (
        runs[(a, case)]["bench"]["latency_ms"]["p99"] / runs[(b, case)]["bench"]["latency_ms"]["p99"]
    )
    return value


def summary(rows: list[dict[str, Any]]) -> list[str]:
    runs: Runs = {(r["system"], r["case"]): r for r in rows if "system" in r}
    out = ["\n== summary (one run each, same machine, same client)"]
    out.append(f"{'case':<10} {'system':<9} {'req/s':>8} {'p99 ms':>8} {'errors':>6} {'hit ratio':>9}")
    for (system, case), r in runs.items():
        b = r["bench"]
        hit = hit_ratio(r["loads"], b["requests"]) if case == "zipf" else math.nan
        out.append(
            f"{case:<10} {system:<9} {b['requests_per_second']:>8.1f} {b['latency_ms']['p99']:>8.1f} "
            f"{b['errors']:>6} {hit:>9.3f}"
        )
    rps = "requests_per_second"
    out.append("")
    out.append(
        f"one model: modelmux / Ray requests/s  "
        f"{ratio(runs, 'modelmux', 'ray', 'one_model', rps):.1f}x (target >= 10)"
    )
    out.append(
        f"one model: modelmux p99 / Ray p99     "
        f"{p99_ratio(runs, 'modelmux', 'ray', 'one_model'):.3f} (target <= 0.2)"
    )
    out.append(
        f"one model: modelmux / uvicorn req/s   "
        f"{ratio(runs, 'modelmux', 'uvicorn', 'one_model', rps):.2f}x (target >= 0.7)"
    )
    out.append(
        f"zipf:      modelmux / Ray requests/s  "
        f"{ratio(runs, 'modelmux', 'ray', 'zipf', rps):.1f}x (target >= 4)"
    )
    for r in rows:
        if "memory_kb" in r:
            m = r["memory_kb"]
            out.append(
                f"memory: router {m['router'] / 1024:.0f} MiB; workers {m['workers']} KiB; "
                f"a bare Python importing the app {m['bare_python_importing_app'] / 1024:.0f} MiB"
            )
    return out


def main(argv: list[str]) -> int:
    if argv == ["bare-rss"]:
        print(bare_rss_kb())
    elif argv[:1] == ["summary"] and len(argv) == 2:
        with open(argv[1]) as f:
            rows = [json.loads(line) for line in f]
        print("\n".join(summary(rows)))
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""scripts/bench-ray-peer's summary: each run's requests/s against Ray Serve's 67 req/s on this
workload, its hit ratio against the offline global LRU's and Belady's optimum, and the bounds
on requests/s the settings allow.

Usage: LOADS_AT_ONCE=N python3 scripts/lib/bench_ray_peer.py RESULT_JSON...   (one per run)"""

from __future__ import annotations

import json
import os
import sys

RAY, SLOTS, LOAD_S = 67.0, 16, 0.1


def slots_bound(optimal_hit: float, slots: int = SLOTS, load_s: float = LOAD_S) -> float:
    """Requests/s at most: each slot does one load at a time, and a request needs a load with
    probability (1 - hit), hit at best Belady's optimal hit ratio."""
    return slots / load_s / (1 - optimal_hit)


def load_bound(at_once: int, hit: float, load_s: float = LOAD_S) -> float:
    """Requests/s at most with `at_once` loads running at once and the hit ratio reached."""
    return at_once / load_s / max(1 - hit, 1e-9)


def summary(results: list[str], at_once: int) -> list[str]:
    out = ["\n== summary (Ray Serve: 67 req/s on this workload)"]
    out.append(
        f"{'run':>3} {'req/s':>7} {'x Ray':>6} {'p99 ms':>7} {'errors':>6} {'hit':>6} {'LRU':>6} "
        f"{'optimal':>7} {'bound':>7} {'of bound':>8} {'load-bound':>10} {'of it':>6}"
    )
    for i, raw in enumerate(results, 1):
        r = json.loads(raw)
        rps, hit = r["requests_per_second"], r["server"]["hit_ratio"]
        lru, opt = r["global_lru"]["hit_ratio"], r["global_optimal"]["hit_ratio"]
        bound = slots_bound(opt)
        here = load_bound(at_once, hit)
        out.append(
            f"{i:>3} {rps:7.0f} {rps / RAY:6.1f} {r['latency_ms']['p99']:7.0f} {r['errors']:>6} "
            f"{hit:6.3f} {lru:6.3f} {opt:7.3f} {bound:7.0f} {rps / bound:8.0%} {here:10.0f} "
            f"{rps / here:6.0%}"
        )
    out.append(
        f"bound: {SLOTS} slots x 1 load per {LOAD_S * 1000:.0f} ms = {SLOTS / LOAD_S:.0f} loads/s, "
        f"divided by the optimal miss ratio (loose: every slot loading all the time)"
    )
    out.append(
        f"load-bound: {at_once} loads at once x 1 per {LOAD_S * 1000:.0f} ms = "
        f"{at_once / LOAD_S:.0f} loads/s, divided by the miss ratio reached"
    )
    return out


def main(argv: list[str]) -> int:
    print("\n".join(summary(argv, int(os.environ["LOADS_AT_ONCE"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

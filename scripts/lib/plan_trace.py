"""A trace for scripts/bench-plan: REQUESTS arrivals (a Poisson process at RATE per second),
each naming one of MODELS ids with Zipf(1.0) popularity, as the CSV `modelmux plan` reads.
Deterministic (seeded).

Usage: python3 scripts/lib/plan_trace.py REQUESTS MODELS RATE > trace.csv"""

from __future__ import annotations

import bisect
import itertools
import random
import sys


def main(requests: int, models: int, rate: float) -> None:
    rng = random.Random(7)
    cumulative = list(itertools.accumulate(1.0 / k for k in range(1, models + 1)))
    out = sys.stdout
    out.write("timestamp,model_id\n")
    t = 0.0
    lines = []
    for _ in range(requests):
        t += rng.expovariate(rate)
        m = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
        lines.append(f"{t:.6f},m{m}\n")
        if len(lines) == 65536:
            out.write("".join(lines))
            lines.clear()
    out.write("".join(lines))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))

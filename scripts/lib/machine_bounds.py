"""The machine's bounds for scripts/bench-llm and bench-llm-families (needs numpy; run on the
bench virtualenv's Python, from scripts/llm/bench-env.sh).

  machine_bounds.py bandwidth N...   memory read bandwidth in GB/s (numpy sum of 1 GiB f32,
                                     split over N threads), for each N, space-separated
  machine_bounds.py gemm             f32 GEMM 2048^3 GFLOP/s on the threads OpenBLAS is given"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


def best_seconds(f: Callable[[], object], repeats: int = 3) -> float:
    """The fastest of `repeats` timed calls of f, after one untimed."""
    f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def bandwidth(threads: list[int]) -> list[float]:
    import numpy as np

    a = np.ones(1 << 28, dtype=np.float32)  # 1 GiB

    def split(n: int) -> Callable[[], object]:
        parts = np.array_split(a, n)

        def run() -> None:
            ts = [threading.Thread(target=p.sum) for p in parts]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

        return a.sum if n == 1 else run

    return [a.nbytes / best_seconds(split(n)) / 1e9 for n in threads]


def gemm_gflops(n: int = 2048) -> float:
    import numpy as np

    a = np.random.rand(n, n).astype(np.float32)
    b = a.copy()
    return 2 * n**3 / best_seconds(lambda: a @ b) / 1e9


def main(argv: list[str]) -> int:
    if argv[:1] == ["bandwidth"] and len(argv) > 1:
        print(*bandwidth([int(n) for n in argv[1:]]))
    elif argv == ["gemm"]:
        print(gemm_gflops())
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

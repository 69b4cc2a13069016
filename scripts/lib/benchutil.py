"""What the benchmark scripts' reports share: the figures they compute (medians, percentiles),
the machine they ran on, and small shell helpers. Standard library only: the scripts run these
modules on whatever python3 the machine has."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def median_high(values: Iterable[float]) -> float:
    """The middle value, the higher of the two middles for an even count (`sorted[n // 2]`)."""
    s = sorted(values)
    return s[len(s) // 2]


def median_low(values: Iterable[float]) -> float:
    """The middle value, the lower of the two middles for an even count (`sorted[(n - 1) // 2]`)."""
    s = sorted(values)
    return s[(len(s) - 1) // 2]


def nearest_rank(values: Sequence[float], p: float) -> float:
    """The p-quantile (0..1) by nearest rank (`ceil(p * n)`-th smallest, at least the first);
    0.0 when there are none."""
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(p * len(s)))) - 1] if s else 0.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpuinfo_lines() -> list[str]:
    with open("/proc/cpuinfo") as f:
        return f.readlines()


def cpu_model(lines: Iterable[str], default: str = "?") -> str:
    """The first `model name` of /proc/cpuinfo's lines."""
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), default
    )


def simd_level(cpuinfo: str, none: str = "no AVX2") -> str:
    """The widest of the SIMD levels the engine's kernels use that the CPU flags name."""
    if "avx512_vnni" in cpuinfo:
        return "AVX-512 VNNI"
    return "AVX2" if "avx2" in cpuinfo else none


def report_targets(path: str, report: Callable[[dict[str, dict[str, Any]]], tuple[list[str], list[str]]]) -> int:
    """Prints the CPU and `report`'s table for the JSON lines at `path` (one object per
    scenario, keyed by its `scenario`), then the targets missed; 1 when any was."""
    with open(path) as f:
        rows = {r["scenario"]: r for r in map(json.loads, f)}
    cpuinfo = cpuinfo_lines()
    cores = len([line for line in cpuinfo if line.startswith("processor")])
    print(f"\nCPU: {cpu_model(cpuinfo)} ({simd_level(''.join(cpuinfo))}), {cores} cores\n")
    lines, missed = report(rows)
    print("\n".join(lines))
    if missed:
        print("\nmissed: " + "; ".join(missed))
        return 1
    return 0

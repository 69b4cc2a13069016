"""The physical bounds on decode tok/s that scripts/bench-llm and scripts/bench-llm-families
judge the engine against: the bytes one decode step reads, the FLOPs a token costs, and what
the machine's memory bandwidth and GEMM throughput allow for them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Bytes per 32 weights as the engine stores a matrix: a 4-bit type in the 4-bit format
# (Q4_1's size: 20 B), any other as int8 blocks with an f16 scale (34 B).
FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
FOUR_BIT_BYTES, INT8_BYTES = 20, 34


def step_bytes_and_params(tensors: Iterable[Any]) -> tuple[int, int]:
    """(bytes one decode step reads with the default weights, parameters) of a GGUF's tensors
    (gguf.GGUFReader's: `n_elements`, `shape`, `tensor_type.name`): a matrix stored in a 4-bit
    type in the 4-bit format, any other matrix as int8 blocks (the tied Q8_0 embedding/head
    included), vectors as f32."""
    step_bytes = params = 0
    for t in tensors:
        n = int(t.n_elements)
        params += n
        if len(t.shape) < 2:
            step_bytes += 4 * n
        else:
            per_block = FOUR_BIT_BYTES if t.tensor_type.name in FOUR_BIT_TYPES else INT8_BYTES
            step_bytes += n // 32 * per_block
    return step_bytes, params


def memory_bound(bandwidth_gb_s: float, step_bytes: int) -> float:
    """tok/s of one stream when every weight is read once per token."""
    return bandwidth_gb_s * 1e9 / step_bytes


def compute_bound(gflop_s: float, params: int) -> float:
    """tok/s of any batch at 2 FLOPs per parameter per token."""
    return gflop_s * 1e9 / (2 * params)


def decode_bounds(bandwidth_gb_s: float, gflop_s: float, step_bytes: int, params: int,
                  streams: int = 8) -> tuple[float, float]:
    """(one stream's bound, `streams` streams' bound: they share each weight read)."""
    mem, flop = memory_bound(bandwidth_gb_s, step_bytes), compute_bound(gflop_s, params)
    return min(mem, flop), min(streams * mem, flop)

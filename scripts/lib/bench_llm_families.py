"""scripts/bench-llm-families' Python (the table runs on the bench virtualenv's Python: it
reads the GGUFs with gguf).

  bench_llm_families.py typed-round LINE FAMILY "BW1 BW2" "BW1 BW2"
      one typed file's single-stream line, with its name and the bandwidth (the better of 1
      and 2 threads) measured just before and after it
  bench_llm_families.py tag FAMILY ROUND < a bench_llm line
      the line with its family and round
  bench_llm_families.py table OURS.jsonl LLAMA.jsonl FAMILIES_DIR "BW1 BW2" TOKENS RUNS TYPED.jsonl
      the markdown table; exits 1 when a target is missed"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

from benchutil import median_low as median
from benchutil import simd_level
from llm_bounds import step_bytes_and_params

FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "gemma3"]
TYPED = [("llama-q8_0", "Q8_0 matrices (llama shape"),
         ("llama-q4_k", "Q4_K matrices (llama shape at d_model 768")]
WITHIN_LLAMA, OVER_LLAMA_CPP, OF_MEMORY_BOUND = 0.85, 1.2, 0.85

Figures = dict[tuple[str, str, int], dict[str, Any]]


def typed_round(line: dict[str, Any], family: str, before: list[float], after: list[float]) -> dict[str, Any]:
    d = dict(line)
    d.update(family=family, bw_before=max(before[:2]), bw_after=max(after[:2]))
    return d


def figure(ours: Figures, rounds_run: list[int], family: str, scenario: str, key: str) -> tuple[float, float]:
    """The family's figure in the median round, and its ratio to llama's of the same round
    (the median of the rounds' ratios)."""
    ratios = [ours[(family, scenario, r)][key] / ours[("llama", scenario, r)][key] for r in rounds_run]
    return median(ours[(family, scenario, r)][key] for r in rounds_run), median(ratios)


def share_of_bound(d: dict[str, Any], step_bytes: int) -> float:
    """A round's tok/s over the memory bound of the bandwidth measured around it."""
    share: float = d["decode_tok_s"] * step_bytes / ((d["bw_before"] + d["bw_after"]) / 2 * 1e9)
    return share


def table(argv: list[str]) -> int:
    from gguf import GGUFReader  # the bench virtualenv's

    ours: Figures = {}
    llama: Figures = {}
    for path, into in ((argv[0], ours), (argv[1], llama)):
        with open(path) as f:
            for d in map(json.loads, f):
                into[(d["family"], d["scenario"], d.get("round", 0))] = d
    rounds_run = sorted({r for (_, _, r) in ours if r})
    families_dir, bw, tokens, runs = argv[2], max(map(float, argv[3].split())), argv[4], argv[5]

    def step_bytes(family: str) -> int:
        """Bytes one decode step reads with the default weights (llm_bounds)."""
        return step_bytes_and_params(GGUFReader(os.path.join(families_dir, family + ".gguf")).tensors)[0]

    with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines(keepends=True) if line.startswith("model name")), platform.processor())
    isa = simd_level(cpuinfo, none="baseline")
    print(f"\n## Model families at SmolLM2-135M's size ({tokens} tokens, median of {runs} runs; {len(rounds_run)} rounds, each family against llama in the same round, the median round's ratio)\n")
    print(f"Machine: {cpu}, {os.cpu_count()} cores, {isa}; memory read bandwidth {bw:.1f} GB/s (numpy).\n")
    print("| family | single tok/s | vs llama | 8 streams tok/s | vs llama | llama.cpp single | vs llama.cpp | memory bound (1 stream) |")
    print("|---|---|---|---|---|---|---|---|")
    misses = []

    def mark(ok: bool) -> str:
        return "✓" if ok else "✗"

    for family in FAMILIES:
        one, r1 = figure(ours, rounds_run, family, "single", "decode_tok_s")
        eight, r8 = figure(ours, rounds_run, family, "base8", "aggregate_tok_s")
        theirs = llama.get((family, "single", 0), {}).get("decode_tok_s")
        bound = bw * 1e9 / step_bytes(family)
        rl = one / theirs if theirs else None
        if r1 < WITHIN_LLAMA:
            misses.append(f"{family} single {r1:.2f} of llama")
        if r8 < WITHIN_LLAMA:
            misses.append(f"{family} 8 streams {r8:.2f} of llama")
        if rl is None or rl < OVER_LLAMA_CPP:
            misses.append(f"{family} {rl and f'{rl:.2f}'}x llama.cpp")
        if theirs and rl is not None:
            print(f"| {family} | {one:.0f} | {r1:.2f} {mark(r1 >= 0.85)} | {eight:.0f} | {r8:.2f} {mark(r8 >= 0.85)} | "
                  f"{theirs:.0f} | {rl:.2f}x {mark(rl >= 1.2)} | {bound:.0f} ({one / bound:.0%}) |")
        else:
            print(f"| {family} | {one:.0f} | {r1:.2f} | {eight:.0f} | {r8:.2f} | - | - | {bound:.0f} |")
    print()
    with open(argv[6]) as f:
        rounds = [json.loads(line) for line in f]
    for typed, what in TYPED:
        # Each round against the bandwidth measured just before and after it; the median round.
        judged = sorted(((share_of_bound(d, step_bytes(typed)), d) for d in rounds if d["family"] == typed),
                        key=lambda sd: sd[0])
        share, d = judged[(len(judged) - 1) // 2]
        one, bound = d["decode_tok_s"], (d["bw_before"] + d["bw_after"]) / 2 * 1e9 / step_bytes(typed)
        if share < OF_MEMORY_BOUND:
            misses.append(f"{typed} single {share:.0%} of its memory bound")
        each = ", ".join(f"{s:.0%}" for s, _ in judged)
        print(f"{what}, {step_bytes(typed) / 2**20:.1f} MiB a step): one stream {one:.0f} tok/s, "
              f"{share:.0%} of the {bound:.0f} tok/s memory bound {'✓' if share >= 0.85 else '✗'} (target >= 85%; "
              f"median of {len(judged)} rounds, each against the bandwidth around it: {each}).")
    print("\nTargets: within 15% of the llama-shaped figure at 1 and 8 streams; >= 1.2x llama.cpp's single stream; Q8_0 and Q4_K >= 85% of their memory bound.")
    if misses:
        print("\nMissed: " + "; ".join(misses))
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["typed-round"] and len(argv) == 5:
        before, after = ([float(x) for x in a.split()] for a in argv[3:5])
        print(json.dumps(typed_round(json.loads(argv[1]), argv[2], before, after)))
        return 0
    if argv[:1] == ["tag"] and len(argv) == 3:
        d = json.loads(sys.stdin.read())
        d["family"] = argv[1]
        d["round"] = int(argv[2])
        print(json.dumps(d))
        return 0
    if argv[:1] == ["table"] and len(argv) == 8:
        return table(argv[1:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

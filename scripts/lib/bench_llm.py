"""scripts/bench-llm's Python (run on the bench virtualenv's Python: the table reads the GGUF
with gguf).

  bench_llm.py bounds-round SINGLE_JSON BASE8_JSON "BW1 BW2 GF" "BW1 BW2 GF"
      one round of single and base8 between two measurements of the machine: its figures
      with the bandwidth (the best of 1 and 2 threads) and GEMM throughput averaged around it
  bench_llm.py prefix < bench_prefix's lines
      bench_prefix's miss and hit TTFT as one `prefix` line
  bench_llm.py table OURS.jsonl LLAMA.jsonl GGUF "BW1 BW2" GF1 GF2 TOKENS RUNS BOUNDS.jsonl
      the markdown tables; exits 1 when a figure with a target misses it or is missing"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from llm_bounds import compute_bound, decode_bounds, memory_bound, step_bytes_and_params

Scenarios = dict[str, dict[str, Any]]


def bounds_round(single: dict[str, Any], base8: dict[str, Any], before: list[float],
                 after: list[float]) -> dict[str, float]:
    """A round's figures, with the bandwidth and GEMM throughput measured around it: each
    measurement's bandwidth is its better thread count's, and the two are averaged."""
    return {"single": single["decode_tok_s"], "base8": base8["decode_all_tok_s"],
            "bw": (max(before[:2]) + max(after[:2])) / 2, "gf": (before[2] + after[2]) / 2}


def prefix_line(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    return {"scenario": "prefix", "prefix_tokens": 1000, "miss_ttft_ms": off["ttft_median_ms"],
            "hit_ttft_ms": on["ttft_median_ms"], "hits": on["prefix_cache_hits"]}


def fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else (f"{v:.3g}{unit}" if abs(v) < 100 else f"{v:.0f}{unit}")


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def round_bounds(r: dict[str, float], step_bytes: int, params: int) -> dict[str, float]:
    """The single and base8 bounds of one round's measurements."""
    single, base8 = decode_bounds(r["bw"], r["gf"], step_bytes, params)
    return {"single": single, "base8": base8}


def paired(rounds: list[dict[str, float]], scenario: str, step_bytes: int,
           params: int) -> tuple[tuple[float, dict[str, float]], list[float]]:
    """The median round by its share of the bound measured around it, and every round's share."""
    shares = sorted(
        ((r[scenario] / round_bounds(r, step_bytes, params)[scenario], r) for r in rounds),
        key=lambda sr: sr[0],
    )
    return shares[(len(shares) - 1) // 2], [s for s, _ in shares]


class Table:
    """The rows, and the figures with a target that missed it or are missing."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.missed: list[str] = []

    def mark(self, name: str, r: float | None, check: Callable[[float], bool] | None) -> str:
        """The row's mark: ✓ when `r` meets the target, ✗ when it does not or is missing."""
        if check is None:
            return ""
        if r is None:
            self.missed.append(f"{name}: missing")
            return " ✗ (missing)"
        if check(r):
            return " ✓"
        self.missed.append(f"{name}: {fmt(r, 'x')}")
        return " ✗"

    def row(self, name: str, a: float | None, b: float | None, target: str,
            check: Callable[[float], bool] | None = None, unit: str = "") -> None:
        r = ratio(a, b)
        self.rows.append(f"| {name} | {fmt(a, unit)} | {fmt(b, unit)} | {fmt(r, 'x')} | {target}{self.mark(name, r, check)} |")


def load(path: str) -> Scenarios:
    with open(path) as f:
        return {d["scenario"]: d for d in map(json.loads, f)}


def table(argv: list[str]) -> int:
    from gguf import GGUFReader  # the bench virtualenv's

    ours, llama = load(argv[0]), load(argv[1])
    bw1, bw2 = map(float, argv[3].split())
    gf1, gf2 = float(argv[4]), float(argv[5])
    tokens, runs = argv[6], argv[7]
    step_bytes, params = step_bytes_and_params(GGUFReader(argv[2]).tensors)
    bw, gf = max(bw1, bw2), max(gf1, gf2)
    mem_bound = memory_bound(bw, step_bytes)  # one stream: every weight read once per token
    flop_bound = compute_bound(gf, params)  # any batch: 2 FLOPs per parameter per token
    single_bound, batch_bound = decode_bounds(bw, gf, step_bytes, params)  # 8 streams share each read
    f = fmt
    o, lc = ours, llama
    t = Table()
    rows, mark, row = t.rows, t.mark, t.row

    row("single: decode tok/s", get(o, "single", "decode_tok_s"), get(lc, "single", "decode_tok_s"), ">= 1.3x", lambda r: r >= 1.3)
    row("single: TTFT ms", get(o, "single", "ttft_median_ms"), get(lc, "single", "ttft_median_ms"), "")
    row("base8: aggregate tok/s", get(o, "base8", "aggregate_tok_s"), get(lc, "base8", "aggregate_tok_s"), "")
    row("base8: decode tok/s, the 8 streams together", get(o, "base8", "decode_all_tok_s"), get(lc, "base8", "decode_all_tok_s"), "")
    row("base8: TTFT median / max ms", get(o, "base8", "ttft_median_ms"), get(lc, "base8", "ttft_median_ms"), f"max {f(get(o, 'base8', 'ttft_max_ms'))} vs {f(get(lc, 'base8', 'ttft_max_ms'))}")
    row("adapters8: aggregate tok/s", get(o, "adapters8", "aggregate_tok_s"), get(lc, "adapters8", "aggregate_tok_s"), ">= 3x", lambda r: r >= 3.0)
    row("adapters8: TTFT median ms", get(o, "adapters8", "ttft_median_ms"), get(lc, "adapters8", "ttft_median_ms"), f"max {f(get(o, 'adapters8', 'ttft_max_ms'))} vs {f(get(lc, 'adapters8', 'ttft_max_ms'))}")
    # modelmux's: adapters8 runs each paired with a base-model run in the same runtime, in
    # alternating order (median of the pairs' ratios): the separate scenarios' ratio, beside it,
    # also carries the machine's drift between them. llama.cpp's: the separate scenarios.
    a8b8 = get(o, "adapters8", "vs_base_paired")
    a8b8_apart = ratio(get(o, "adapters8", "aggregate_tok_s"), get(o, "base8", "aggregate_tok_s"))
    l8b8 = ratio(get(lc, "adapters8", "aggregate_tok_s"), get(lc, "base8", "aggregate_tok_s"))
    rows.append(f"| adapters8 / base8 aggregate (modelmux: paired runs; separate scenarios {f(a8b8_apart, 'x')}) | {f(a8b8, 'x')} | {f(l8b8, 'x')} | | >= 0.92 (modelmux){mark('adapters8 / base8', a8b8, lambda r: r >= 0.92)} |")
    for q in ("median", "p90"):
        row(f"cycle16: TTFT {q} ms, 16 adapters / 8 slots (llama.cpp: all 16 loaded)", get(o, "cycle16", "cycling", f"ttft_{q}_ms"), get(lc, "cycle16", f"ttft_{q}_ms"), "")
        c = get(o, "cycle16", f"ratio_{q}")
        rows.append(f"| cycle16: TTFT {q}, 8 slots / 16 slots all cached | {f(get(o, 'cycle16', 'cycling', f'ttft_{q}_ms'))} / {f(get(o, 'cycle16', 'cached', f'ttft_{q}_ms'))} ms | | {f(c, 'x')} | <= 3x{mark(f'cycle16 TTFT {q} ratio', c, lambda r: r <= 3)} |")
    al = o.get("adapter_load", {})
    rows.append(f"| adapter load (rank {al.get('rank')}, {f(al.get('file_bytes', 0) / 2**20)} MiB) vs std::fs::read ms | {f(al.get('load_ms'))} vs {f(al.get('read_ms'))} (parse {f(al.get('parse_ms'))}) | | {f(al.get('ratio'), 'x')} | report |")
    row("HTTP, 8 streams / 8 adapters: aggregate tok/s (vs llama.cpp adapters8)", get(o, "http8", "aggregate_tok_s"), get(lc, "adapters8", "aggregate_tok_s"), ">= 3x", lambda r: r >= 3.0)
    row("HTTP / engine called directly, 8 streams / 8 adapters tok/s", get(o, "http8", "aggregate_tok_s"), get(o, "engine8", "aggregate_tok_s"), ">= 0.95 (modelmux both)", lambda r: r >= 0.95)
    for n in (1, 8, 32):
        tt = o.get(f"ttft_http_{n}", {})
        floor, p99 = tt.get("prefill_floor_ms"), tt.get("ttft_p99_ms")
        r = p99 / floor if floor and p99 is not None else None
        # The floor: the engine's first tokens for the same prompts on the same adapters, all
        # submitted at once (issue 21 judges the 32-stream figure against 1.25x of it).
        target = f"p99 <= 1.25x floor{mark(f'TTFT p99 / floor, {n} streams', r, lambda r: r <= 1.25)}" if n == 32 else "report"
        rows.append(f"| HTTP TTFT p50 / p99 ms, {n} concurrent stream(s); engine floor (all at once) | {f(tt.get('ttft_p50_ms'))} / {f(p99)}; floor {f(floor)} | | {f(r, 'x')} | {target} |")
    px = o.get("prefix", {})
    px_r = px["miss_ttft_ms"] / px["hit_ttft_ms"] if px.get("hit_ttft_ms") else None
    rows.append(f"| prefix cache, {px.get('prefix_tokens')}-token shared prompt: TTFT miss / hit ms | {f(px.get('miss_ttft_ms'))} / {f(px.get('hit_ttft_ms'))} | | {f(px_r, 'x')} | >= 5x lower on a hit{mark('prefix hit TTFT', px_r, lambda r: r >= 5)} |")
    rp = o.get("replicas", {})
    rows.append(f"| HTTP, 8 base-model streams: 2 replicas / 1 replica tok/s (paired alternating rounds) | {f(rp.get('base8_2_tok_s'))} / {f(rp.get('base8_1_tok_s'))} | | {f(rp.get('two_vs_one'), 'x')} | >= 0.95{mark('2 replicas / 1 replica', rp.get('two_vs_one'), lambda r: r >= 0.95)} |")
    dm = o.get("demo", {})
    rows.append(f"| HTTP, the demo's settings (examples/llm.yaml: {dm.get('replicas')} replicas, {dm.get('adapter_slots')} adapter slots): 8 streams mixed over {dm.get('adapter_slots')} adapters / on the base model tok/s (paired rounds) | {f(dm.get('mixed8_tok_s'))} / {f(dm.get('base8_tok_s'))} | | {f(dm.get('mixed_vs_base'), 'x')} | >= 0.92{mark('HTTP demo settings: mixed adapters / base', dm.get('mixed_vs_base'), lambda r: r >= 0.92)} |")
    rows.append(f"| HTTP, 2 replicas: 8 streams on 8 adapters / on the base model tok/s (paired rounds) | {f(rp.get('adapters8_2_tok_s'))} / {f(rp.get('base8_2_tok_s'))} | | {f(rp.get('adapters_vs_base_2'), 'x')} | >= 0.92{mark('HTTP adapters8 / base8, 2 replicas', rp.get('adapters_vs_base_2'), lambda r: r >= 0.92)} |")
    m = o.get("memory", {})
    rows.append(f"| memory: peak RSS vs weights + adapters + KV + prefix cache MiB ({m.get('streams')} x {m.get('seq_tokens')} tokens) | {f(m.get('hwm_run_mib'))} vs {f(m.get('weight_mib'))} + {f(m.get('adapter_mib'))} + {f(m.get('kv_mib'))} + {f(m.get('prefix_cache_mib'))} = {f(m.get('expected_mib'))} | | {f(m.get('ratio_hwm_to_expected'), 'x')} | report |")

    print(f"\n## LLM benchmark: modelmux vs llama.cpp ({tokens} tokens per stream, {runs} run(s), 8 streams)\n")
    print("| figure | modelmux | llama.cpp | ratio | target |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nmemory detail: RSS start {f(m.get('rss_start_mib'))}, after model {f(m.get('rss_model_mib'))} (HWM {f(m.get('hwm_model_mib'))}), "
          f"after adapters {f(m.get('rss_adapters_mib'))}, after run {f(m.get('rss_run_mib'))} (HWM {f(m.get('hwm_run_mib'))}) MiB, run {f(m.get('run_s'))} s")
    fw = o.get("forward", {})
    print("\n## Where modelmux's time goes (LlamaModel::forward alone, medians)\n")
    print("| step | ms | ms per row | GFLOP/s (2 x params x rows) | engine decode step ms |")
    print("|---|---|---|---|---|")

    def step_ms(scenario: str) -> float | None:
        rate = get(o, scenario, "decode_tok_s")
        return 1e3 / rate if rate else None

    for name, key, n_rows, engine in [
            ("decode, 1 row", "step1_ms", 1, step_ms("single")),
            (f"decode, {fw.get('rows')} rows, base", "step_base_ms", fw.get("rows"), step_ms("base8")),
            (f"decode, {fw.get('rows')} rows, {fw.get('rows')} adapters", "step_adapters_ms", fw.get("rows"), step_ms("adapters8")),
            (f"decode, {fw.get('rows')} rows, 1 adapter on all", "step_one_adapter_ms", fw.get("rows"), None),
            (f"prefill, {fw.get('prompt_tokens')}-token prompt", "prefill_ms", fw.get("prompt_tokens"), None)]:
        ms = fw.get(key)
        if ms and n_rows:
            print(f"| {name} | {f(ms)} | {f(ms / n_rows)} | {f(2 * params * n_rows / ms / 1e6)} | {f(engine)} |")
    print("\n(engine decode step = 1000 / a stream's decode tok/s in that scenario, median over streams; in"
          " base8/adapters8 it includes the other prompts' last prefill step. The aggregate tok/s of"
          " base8/adapters8 includes the 8 prompts' prefill, ~2 steps of up to 256 rows.)")

    print("\n## Physical bounds of this machine\n")
    cpu: dict[str, str] = {}
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            key, _, value = line.partition(":")
            cpu.setdefault(key.strip(), value.strip())
    flags = set(cpu.get("flags", "").split())
    print(f"- CPU: {cpu.get('model name', 'unknown')}; " + ", ".join(f"{x} {'yes' if x in flags else 'NO'}" for x in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni")))
    print(f"- matrix kernel that ran: {get(o, 'prompt', 'kernel') or 'unknown'}" + (f" (capped by MODELMUX_KERNEL={os.environ['MODELMUX_KERNEL']})" if os.environ.get("MODELMUX_KERNEL") else ""))
    if os.environ.get("LLAMA_FLAGS"):
        print(f"- llama-server ran with {os.environ['LLAMA_FLAGS']}: at its defaults it exited at start on this CPU (AMX weight repacking)")
    print(f"- memory read bandwidth (numpy sum of 1 GiB f32): {bw1:.1f} GB/s 1 thread, {bw2:.1f} GB/s 2 threads")
    emulated = os.environ.get("MODELMUX_KERNEL") == "avx2" and not os.environ.get("OPENBLAS_CORETYPE")
    print(f"- f32 GEMM 2048^3 (numpy/OpenBLAS{', held to its AVX2 kernels: OPENBLAS_CORETYPE=Haswell' if emulated else ''}): {gf1:.1f} GFLOP/s 1 thread, {gf2:.1f} GFLOP/s 2 threads")
    print(f"- bytes read per decode step (the engine's formats: 4-bit types as 4-bit, the rest as int8; from the GGUF): {step_bytes / 2**20:.1f} MiB; {params / 1e6:.1f} M parameters, {2 * params / 1e6:.0f} MFLOP per token")
    print(f"- decode bound, one stream: min({mem_bound:.0f} tok/s memory, {flop_bound:.0f} tok/s compute) = {single_bound:.0f} tok/s")
    print(f"- decode bound, 8 streams: min({8 * mem_bound:.0f} tok/s memory, {flop_bound:.0f} tok/s compute) = {batch_bound:.0f} tok/s\n")
    print("| figure | bound tok/s | modelmux | llama.cpp | target (modelmux) |")
    print("|---|---|---|---|---|")
    # modelmux's shares: each round against the bounds measured around it, the median round.
    with open(argv[8]) as bounds_file:
        rounds = [json.loads(line) for line in bounds_file]
    # base8 is judged by its decode (the tokens that arrived while all 8 streams were decoding, over
    # that time), which is what the decode bound bounds; its aggregate also counts the 8 prompts' prefill in its time (368 prompt
    # tokens for 512 generated ones), so even at the compute bound it would read about 0.6 of it.
    for name, keys, bound, share in [("single decode", ("single", "decode_tok_s"), single_bound, 0.9),
                                     ("base8 decode, 8 streams", ("base8", "decode_all_tok_s"), batch_bound, 0.6),
                                     ("base8 aggregate, prefill included", ("base8", "aggregate_tok_s"), batch_bound, None),
                                     ("adapters8 aggregate", ("adapters8", "aggregate_tok_s"), batch_bound, None)]:
        cells = [f"{f(get(d, *keys))} ({get(d, *keys) / bound:.0%} of bound)" if get(d, *keys) else "-" for d in (o, lc)]
        ours_share = get(o, *keys) / bound if get(o, *keys) else None
        if share is not None and rounds:
            (ours_share, r), each = paired(rounds, keys[0], step_bytes, params)
            cells[0] = (f"{f(r[keys[0]])} ({ours_share:.0%} of the bound around it, {round_bounds(r, step_bytes, params)[keys[0]]:.0f}; "
                        f"rounds {', '.join(f'{x:.0%}' for x in each)})")
        target = "" if share is None else f">= {share:.0%} of bound{mark(f'{name} / bound', ours_share, lambda r, s=share: r >= s)}"
        print(f"| {name} | {bound:.0f} | {cells[0]} | {cells[1]} | {target} |")
    print("\n(The compute bound uses f32 GEMM; the 4-bit and int8 kernels use integer dot products, which may go faster."
          " modelmux's single and base8 shares are the median of 3 rounds, each against the bandwidth and GEMM measured"
          " just before and after it; the bound column and llama.cpp's shares use the measurement at the end.)")
    if t.missed:
        print(f"\n{len(t.missed)} target(s) missed: " + "; ".join(t.missed))
        return 1
    print("\nevery target met")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["bounds-round"] and len(argv) == 5:
        before, after = ([float(x) for x in a.split()] for a in argv[3:5])
        print(json.dumps(bounds_round(json.loads(argv[1]), json.loads(argv[2]), before, after)))
        return 0
    if argv == ["prefix"]:
        off, on, _ = [json.loads(line) for line in sys.stdin]
        print(json.dumps(prefix_line(off, on)))
        return 0
    if argv[:1] == ["table"] and len(argv) == 10:
        return table(argv[1:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

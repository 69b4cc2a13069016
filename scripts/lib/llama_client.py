"""llama-server clients over /completion (stdlib only), streamed, greedy, ignore_eos,
cache_prompt false: the equivalents of bench_llm.rs's scenarios that scripts/bench-llm and
scripts/bench-llm-families measure llama.cpp with. Each prints JSON lines.

  python3 scripts/lib/llama_client.py scenarios PORT TOKENS RUNS PROMPT_JSON
      single, base8, adapters8 and cycle16 (scripts/bench-llm; 16 adapters loaded at scale 0,
      one selected per request)
  python3 scripts/lib/llama_client.py single PORT TOKENS RUNS PROMPT_JSON FAMILY
      one stream's decode tok/s after the first token, median of RUNS (bench-llm-families)

PROMPT_JSON is bench_llm's `prompt` line (its `ids`)."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from typing import Any

from benchutil import median_low
from benchutil import nearest_rank as pct


def _completion(port: int, body: dict[str, Any]) -> urllib.request.Request:
    return urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )


def _body(prompt: list[int], n: int) -> dict[str, Any]:
    return {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False, "stream": True}


def request(port: int, prompt: list[int], n: int, lora: int | None) -> dict[str, Any]:
    """One streamed completion: its TTFT, decode time, tokens and each token's arrival."""
    body = _body(prompt, n)
    if lora is not None:
        body["lora"] = [{"id": lora, "scale": 1.0}]
    start = time.perf_counter()
    first = None
    times = []
    with urllib.request.urlopen(_completion(port, body), timeout=600) as resp:
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            if event.get("content") is not None:
                first = first or now
                times.append(now)
            if event.get("stop"):
                n_out = event.get("timings", {}).get("predicted_n") or event.get("tokens_predicted") or n
                return {"ttft": (first or now) - start, "decode": now - (first or now), "tokens": n_out,
                        "start": start, "end": now, "times": times}
    raise RuntimeError("stream ended without stop")


def batch(port: int, prompt: list[int], n: int, loras: list[int | None]) -> tuple[float, list[dict[str, Any]]]:
    """The streams at once, one per entry of `loras`: (wall time, each stream's result)."""
    out: list[dict[str, Any]] = [{} for _ in loras]
    errors: list[Exception] = []

    def one(i: int) -> None:
        try:
            out[i] = request(port, prompt, n, loras[i])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(loras))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    wall = max(o["end"] for o in out) - min(o["start"] for o in out)
    return wall, out


def all_decoding_rate(out: list[dict[str, Any]]) -> float | None:
    """Tokens that arrived while every stream was decoding, over that time (as bench_llm
    counts `decode_all_tok_s`); None when the streams never all decoded at once."""
    lo, hi = max(o["times"][0] for o in out), min(o["times"][-1] for o in out)
    if hi <= lo:
        return None
    return sum(lo < t <= hi for o in out for t in o["times"]) / (hi - lo)


def emit(d: dict[str, Any]) -> None:
    print(json.dumps(d), flush=True)


def scenarios(port: int, tokens: int, runs: int, prompt: list[int]) -> None:
    request(port, prompt, 4, None)  # warm-up
    r = [request(port, prompt, tokens, None) for _ in range(runs)]
    emit({"scenario": "single", "decode_tok_s": pct([(o["tokens"] - 1) / o["decode"] for o in r], 0.5),
          "ttft_median_ms": pct([o["ttft"] * 1e3 for o in r], 0.5)})
    eight: list[tuple[str, list[int | None]]] = [("base8", [None] * 8), ("adapters8", list(range(8)))]
    for name, loras in eight:
        batch(port, prompt, 2, loras)
        rates, sums, ttfts = [], [], []
        for _ in range(runs):
            wall, out = batch(port, prompt, tokens, loras)
            rates.append(sum(o["tokens"] for o in out) / wall)
            rate = all_decoding_rate(out)
            if rate is not None:
                sums.append(rate)
            ttfts += [o["ttft"] * 1e3 for o in out]
        emit({"scenario": name, "aggregate_tok_s": pct(rates, 0.5), "decode_all_tok_s": pct(sums, 0.5) if sums else None,
              "ttft_median_ms": pct(ttfts, 0.5), "ttft_max_ms": pct(ttfts, 1.0)})
    ttfts = []
    for k in range(4 * runs):
        _, out = batch(port, prompt, tokens, [(8 * k + j) % 16 for j in range(8)])
        ttfts += [o["ttft"] * 1e3 for o in out]
    emit({"scenario": "cycle16", "ttft_median_ms": pct(ttfts, 0.5), "ttft_p90_ms": pct(ttfts, 0.9)})


def decode_rate(port: int, prompt: list[int], n: int) -> float:
    """One stream's tokens after the first over the time after the first."""
    first = None
    with urllib.request.urlopen(_completion(port, _body(prompt, n)), timeout=600) as resp:
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            now, event = time.perf_counter(), json.loads(line[6:])
            if first is None and event.get("content") is not None:
                first = now
            if event.get("stop"):
                n_out = event.get("timings", {}).get("predicted_n") or n
                assert first is not None
                rate: float = (n_out - 1) / (now - first)
                return rate
    raise RuntimeError("stream ended without stop")


def single(port: int, tokens: int, runs: int, prompt: list[int], family: str) -> None:
    decode_rate(port, prompt, 4)  # warm-up
    rates = [decode_rate(port, prompt, tokens) for _ in range(runs)]
    print(json.dumps({"family": family, "scenario": "single", "decode_tok_s": median_low(rates)}))


def main(argv: list[str]) -> int:
    if argv[:1] == ["scenarios"] and len(argv) == 5:
        scenarios(int(argv[1]), int(argv[2]), int(argv[3]), json.loads(argv[4])["ids"])
    elif argv[:1] == ["single"] and len(argv) == 6:
        single(int(argv[1]), int(argv[2]), int(argv[3]), json.loads(argv[4])["ids"], argv[5])
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

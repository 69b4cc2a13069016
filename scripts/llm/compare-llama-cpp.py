#!/usr/bin/env python3
"""Checks the numpy reference (reference.py) against llama.cpp itself on GGUF files.

    compare-llama-cpp.py --server BIN/llama-server FILE.gguf [FILE.gguf ...]

For each file: the top 20 log probabilities llama.cpp's `llama-server` gives for the token after
a fixed prompt (the prompt of crates/llm/tests/llm/families.rs), beside the reference's log-softmax
of its logits at the same position. The engine is checked against the reference by the tests;
this checks the reference's reading of each family's conventions (norm offsets, scaling,
windows, soft caps, rotary layout) against the implementation the GGUF files are made for.
Prints one line per file and exits 1 when a file differs by more than --bound.

Not part of the test suite: building llama.cpp takes ~15 min on two cores
(scripts/llm/build-llama-cpp). The tiny files are written by
`cargo test -p modelmux-llm --test llm families::` under target/tmp/modelmux-families-<pid>/.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

PROMPT = [200 + (i * 37) % 3000 for i in range(96)]
TOP = 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cpp_top(server, gguf):
    """llama.cpp's top-TOP (token id, log probability) after PROMPT."""
    port = free_port()
    log = open(gguf + ".llama-server.log", "w")
    proc = subprocess.Popen(
        [server, "-m", gguf, "--port", str(port), "--host", "127.0.0.1", "-c", "256",
         "-t", "1", "--no-warmup", "-fa", "off"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"llama-server did not start for {gguf}: see {log.name}")
            time.sleep(0.2)
        body = json.dumps({"prompt": PROMPT, "n_predict": 1, "n_probs": TOP, "temperature": 0,
                           "cache_prompt": False, "post_sampling_probs": False}).encode()
        req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            doc = json.load(r)
        probs = doc["completion_probabilities"][0]["top_logprobs"]
        return [(p["id"], p["logprob"]) for p in probs]
    finally:
        proc.terminate()
        proc.wait()


def reference_logprobs(gguf):
    cfg, w = reference.load_model(gguf)
    logits = reference.forward(cfg, w, PROMPT).astype(np.float64)
    logits -= logits.max()
    return logits - np.log(np.exp(logits).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True, help="llama.cpp's llama-server binary")
    ap.add_argument("--bound", type=float, default=2e-2,
                    help="largest |llama.cpp - reference| log probability allowed (llama.cpp "
                         "computes GELU and parts of attention in f16)")
    ap.add_argument("gguf", nargs="+")
    args = ap.parse_args()
    worst = 0.0
    for gguf in args.gguf:
        top = llama_cpp_top(args.server, gguf)
        ref = reference_logprobs(gguf)
        diff = max(abs(lp - ref[i]) for i, lp in top)
        ref_top = [int(i) for i in np.argsort(-ref)[:5]]
        same = [i for i, _ in top[:5]] == ref_top
        worst = max(worst, diff)
        print(f"{os.path.basename(gguf)}: max |llama.cpp - reference| over llama.cpp's top {TOP} "
              f"log probabilities {diff:.2e}; top 5 {'equal' if same else 'DIFFER'} "
              f"{[i for i, _ in top[:5]]} vs {ref_top}")
    raise SystemExit(0 if worst <= args.bound else 1)


if __name__ == "__main__":
    main()

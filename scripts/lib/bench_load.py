"""scripts/bench-load's Python.

  PYTHON scripts/lib/bench_load.py s3-get ENDPOINT MODEL
      puts MODEL into the S3 server at ENDPOINT (bucket `bench`) and prints the best of 3 plain
      signed GETs of it, in seconds (needs boto3)
  python3 scripts/lib/bench_load.py summary BYTES CAT_SECONDS GET_SECONDS S3 S3_UNVERIFIED BARE
          INFER INFER8 LOCAL...
      the summary: each stage's MiB/s against the raw read of the same bytes; CAT_SECONDS is
      the `cat` runs' times, comma-separated (the best counts), the others load_throughput's
      and `modelmux bench`'s JSON"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

KEY = "models/large/model.onnx"
# The shell's timer has millisecond resolution.
FLOOR_S = 1e-3


def s3_get(endpoint: str, path: str) -> float:
    import boto3  # the test virtualenv's, not every python3's

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="y",
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket="bench")
    with open(path, "rb") as f:
        s3.put_object(Bucket="bench", Key=KEY, Body=f.read())  # one part: ETag is the MD5
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        body = s3.get_object(Bucket="bench", Key=KEY)["Body"].read()
        best = min(best, time.perf_counter() - t)
        assert len(body) > 0
    return best


def mib_per_s(size_bytes: int, seconds: float) -> float:
    return size_bytes / 2**20 / seconds


def best_seconds(runs: Sequence[dict[str, Any]], stage: str) -> float:
    return min(r[stage]["seconds"] for r in runs)


def summary(size: int, cat_s: float, get_s: float, results: Sequence[dict[str, Any]],
            local: Sequence[dict[str, Any]]) -> list[str]:
    cat_s, get_s = max(cat_s, FLOOR_S), max(get_s, FLOOR_S)
    s3, s3_unverified, bare, infer, infer8 = results
    mib = size / 2**20
    out = [f"\n== summary: model of {mib:.0f} MiB"]
    out.append(f"(a) local disk, raw `cat`: {mib / cat_s:7.0f} MiB/s ({cat_s:.3f} s)")
    for stage in ["read", "parse_decode", "parse_optimize", "load"]:
        t = best_seconds(local, stage)
        out.append(f"    modelmux {stage:15} {mib / t:7.0f} MiB/s ({t:.3f} s)  = {cat_s / t:6.0%} of raw")
    out.append(f"(b) S3 (moto), plain GET:  {mib / get_s:7.0f} MiB/s ({get_s:.3f} s)")
    for run, stage, what in [
        (s3, "fetch", "download, size and MD5 verified, in the disk cache"),
        (s3_unverified, "fetch", "the same with verify_md5 off: size checked only"),
        (s3, "load", "fetch + read + parse + optimize"),
    ]:
        t = run[stage]["seconds"]
        out.append(
            f"    modelmux {stage:6} {mib / t:7.0f} MiB/s ({t:.3f} s)  = {get_s / t:6.0%} of a "
            f"plain GET  ({what})"
        )
    b = bare["requests_per_second"]
    for name, r in [("bare hyper (no model)", bare), ("demo model, one id", infer),
                    ("demo models, 8 ids", infer8)]:
        out.append(
            f"(c) {name:24} {r['requests_per_second']:8.0f} req/s "
            f"({r['requests_per_second'] / b:4.0%} of bare)"
            f"  p50 {r['latency_ms']['p50']:.3f} ms  p99 {r['latency_ms']['p99']:.3f} ms  "
            f"errors {r['errors']}"
        )
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["s3-get"] and len(argv) == 3:
        print(s3_get(argv[1], argv[2]))
    elif argv[:1] == ["summary"] and len(argv) >= 9:
        size, cat_s = int(argv[1]), min(float(t) for t in argv[2].split(","))
        get_s = float(argv[3])
        results = [json.loads(a) for a in argv[4:9]]
        local = [json.loads(a) for a in argv[9:]]
        print("\n".join(summary(size, cat_s, get_s, results, local)))
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

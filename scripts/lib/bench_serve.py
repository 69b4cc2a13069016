"""scripts/bench-serve's Python: the clients it runs beside a server, and its summary.

  python3 scripts/lib/bench_serve.py poll-state      a dashboard's requests without a browser:
                                                     its state every second
  python3 scripts/lib/bench_serve.py deploy-loop     bench/one-model.yaml deployed unchanged
                                                     every 0.5 s, each deploy's ms to DEPLOYS
  python3 scripts/lib/bench_serve.py summary ZIPF_LRU_JSON ZIPF_GDSF_JSON
                                                     the summary of (a), (b) and (c), from the
                                                     rounds' files under /tmp

The rounds' results are /tmp/modelmux-bench-{a,c}-NAME-ROUND.json (`modelmux bench --json`),
the browser's CPU /tmp/modelmux-bench-c-NAME-ROUND.cpu (ms per second). Every median here is
the higher middle (`sorted[n // 2]`) of the interleaved rounds."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from benchutil import median_high as median

TMP = "/tmp"
DEPLOYS = f"{TMP}/modelmux-bench-deploys.txt"
SERVER = "http://127.0.0.1:8100"
# (a): (name, label, the least share of bare hyper's requests/s, or None: reported only).
A_VARIANTS = [
    ("log", "modelmux, access log", 0.85),
    ("nolog", "modelmux, no access log", 0.86),
    ("base_log", "baseline, access log", None),
    ("base_nolog", "baseline, no access log", None),
]
# (c): (name, label, whether its cost against plain is judged: <= 2%).
C_VARIANTS = [
    ("traced", "tracing on, sampled out", True),
    ("polled", "dashboard state polled 1/s", True),
    ("blank", "Chromium open on a blank page", False),
    ("browser", "dashboard open in Chromium", True),
    ("deploying", "deploying every 0.5 s", False),
]
C_MAX_COST = 0.02
DEPLOY_MAX_MS = 50


def poll_state() -> None:
    while True:
        urllib.request.urlopen(f"{SERVER}/-/dashboard/state").read()
        time.sleep(1)


def deploy_loop() -> None:
    with open("bench/one-model.yaml") as f:
        text = f.read()
    with open(DEPLOYS, "w") as out:
        while True:
            req = urllib.request.Request(
                f"{SERVER}/-/deploy",
                json.dumps({"config": text}).encode(),
                {"content-type": "application/json"},
            )
            took = json.load(urllib.request.urlopen(req))["took_ms"]
            out.write(str(took) + "\n")
            out.flush()
            time.sleep(0.5)


def rounds(prefix: str, name: str, tmp: str = TMP) -> list[dict[str, Any]]:
    """The results of rounds 1, 2, ... of one variant, up to the first missing."""
    out = []
    for r in range(1, 100):
        try:
            with open(f"{tmp}/modelmux-bench-{prefix}-{name}-{r}.json") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            break
    return out


def cpu_ms(name: str, tmp: str = TMP) -> float | None:
    """The median of the rounds' browser CPU (ms per second), None when none ran."""
    out = []
    for r in range(1, 100):
        try:
            with open(f"{tmp}/modelmux-bench-c-{name}-{r}.cpu") as f:
                out.append(int(f.read()))
        except (OSError, ValueError):
            break
    return median(out) if out else None


def rps(runs: Sequence[dict[str, Any]]) -> list[float]:
    return [r["requests_per_second"] for r in runs]


def p99(runs: Sequence[dict[str, Any]]) -> list[float]:
    return [r["latency_ms"]["p99"] for r in runs]


def shares_of_bare(runs: Sequence[dict[str, Any]], bare: Sequence[dict[str, Any]]) -> list[float]:
    """Each round's requests/s over bare hyper's of the same round."""
    return [
        r["requests_per_second"] / b["requests_per_second"]
        for r, b in zip(runs, bare, strict=False)
    ]


def cost(variant_rps: float, plain_rps: float) -> float:
    """What a variant costs in requests/s, as a share of the plain server's."""
    return 1 - variant_rps / plain_rps


def loads_ratio(zipf: dict[str, Any]) -> float:
    """The servers' loads per 10k requests over the offline global LRU's."""
    s, g = zipf["server"], zipf["global_lru"]
    ratio: float = s["loads_per_10k_requests"] / g["loads_per_10k_requests"]
    return ratio


def summary(zipf_lru: dict[str, Any], zipf_gdsf: dict[str, Any], tmp: str = TMP) -> list[str]:
    out = ["\n== summary"]
    bare = rounds("a", "bare", tmp)
    out.append(
        f"(a) bare hyper                  {median(rps(bare)):9.0f} req/s  "
        f"p99 {median(p99(bare)):.3f} ms  (medians of {len(bare)} interleaved rounds)"
    )
    for name, label, target in A_VARIANTS:
        rs = rounds("a", name, tmp)
        if not rs:
            continue
        ratios = shares_of_bare(rs, bare)
        share = median(ratios)
        mark = "" if target is None else ("  ✓" if share >= target else "  ✗") + f" (≥ {target:.0%})"
        out.append(
            f"(a) {label:27} {median(rps(rs)):9.0f} req/s  {share:.0%} of bare{mark}"
            f"  (rounds {', '.join(f'{x:.0%}' for x in ratios)})  p99 {median(p99(rs)):.3f} ms"
            f"  errors {sum(r['errors'] for r in rs)}"
        )
    for policy, zipf in [("LRU", zipf_lru), ("GDSF", zipf_gdsf)]:
        s, g = zipf["server"], zipf["global_lru"]
        out.append(
            f"(b) {policy:4} {zipf['requests_per_second']:.0f} req/s, "
            f"p99 {zipf['latency_ms']['p99']:.1f} ms, errors {zipf['errors']}:"
            f" {s['loads']:.0f} loads = {s['loads_per_10k_requests']:.0f}/10k requests, "
            f"hit ratio {s['hit_ratio']:.2%};"
            f" global 16-slot LRU on the same {g['requests']} requests: {g['loads']} loads = "
            f"{g['loads_per_10k_requests']:.0f}/10k,"
            f" hit ratio {g['hit_ratio']:.2%}; ratio {loads_ratio(zipf):.3f}"
        )
    plain_runs = rounds("c", "plain", tmp)
    plain = median(rps(plain_runs))
    out.append(
        f"(c) plain (no access log)        {plain:9.0f} req/s  p99 {median(p99(plain_runs)):.3f} ms"
        f"  (medians of {len(plain_runs)} interleaved rounds;"
        f" plain ranged {min(rps(plain_runs)):.0f} to {max(rps(plain_runs)):.0f})"
    )
    for name, label, judged in C_VARIANTS:
        rs = rounds("c", name, tmp)
        if not rs:
            out.append(f"(c) {label:30} not run")
            continue
        spread = rps(rs)
        c = cost(median(spread), plain)
        mark = ("  ✓ (≤ 2%)" if c <= C_MAX_COST else "  ✗ (> 2%)") if judged else ""
        out.append(
            f"(c) {label:30} {median(spread):9.0f} req/s  cost {c:+.1%}{mark}  "
            f"p99 {median(p99(rs)):.3f} ms  errors {sum(r['errors'] for r in rs)}"
            f"  (runs {min(spread):.0f} to {max(spread):.0f})"
        )
    blank_cpu, page_cpu = cpu_ms("blank", tmp), cpu_ms("browser", tmp)
    if blank_cpu is not None and page_cpu is not None:
        out.append(
            f"(c) Chromium's own CPU meanwhile (medians): {blank_cpu} ms/s on a blank page, "
            f"{page_cpu} ms/s with the dashboard;"
            f" the page's share: {page_cpu - blank_cpu} ms/s = "
            f"{(page_cpu - blank_cpu) / 10:.1f}% of one core"
        )
    try:
        with open(f"{tmp}/modelmux-bench-deploys.txt") as f:
            deploys = [float(x) for x in f.read().split()]
    except OSError:
        deploys = []
    if deploys:
        out.append(
            f"(c) unchanged deploys in the last round: {len(deploys)}, took max "
            f"{max(deploys):.2f} ms, median {median(deploys):.2f} ms"
            f"  {'✓' if max(deploys) <= DEPLOY_MAX_MS else '✗'} (≤ 50 ms)"
        )
    return out


def main(argv: list[str]) -> int:
    if argv == ["poll-state"]:
        poll_state()
    elif argv == ["deploy-loop"]:
        deploy_loop()
    elif argv[:1] == ["summary"] and len(argv) == 3:
        print("\n".join(summary(json.loads(argv[1]), json.loads(argv[2]))))
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the phases measured: the lines printed as they go, the summary's rows, and the
figures (nearest-rank percentiles, milliseconds)."""

import math
import os
import time

ROWS = []


def row(phase, metric, value, target="", ok=None):
    ROWS.append((phase, metric, value, target, "" if ok is None else ("PASS" if ok else "FAIL")))


def section(title):
    print(f"\n== {title}", flush=True)


def say(text):
    print(f"   {text}", flush=True)


def pct(values, q):
    """The q-quantile (0..1) of values, nearest rank; None when empty."""
    if not values:
        return None
    s = sorted(values)
    # The ceil(q * n)-th smallest (q * n rounded first: 0.07 * 100 is 7.000000000000001).
    return s[min(len(s), max(1, math.ceil(round(q * len(s), 9)))) - 1]


def utc_now():
    """The time now as the servers' logs print it (UTC), to find an event in them."""
    return time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1000):03d}Z"


def ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def warnings_in_logs(logs):
    out = []
    for name in sorted(os.listdir(logs)):
        if not name.endswith(".log") or name.startswith("etcd-"):
            continue
        lines = [line for line in open(os.path.join(logs, name), errors="replace")
                 if " WARN " in line or " ERROR " in line]
        if lines:
            out.append((name, len(lines), lines[:3]))
    return out


def print_summary(args, started):
    section(f"summary ({time.monotonic() - started:.0f} s; logs in {args.logs}/)")
    widths = [max(len(r[k]) for r in ROWS + [("phase", "metric", "value", "target", "")])
              for k in range(4)]
    head = ("phase", "metric", "value", "target", "")
    # Phases ran in the order 1, 2, 5, 6, 3, 4 (one cluster for 1, 2, 5, 6, 3); listed by number.
    for r in [head] + sorted(ROWS, key=lambda r: r[0][:1]):
        print("  " + "  ".join(r[k].ljust(widths[k]) for k in range(4)) + "  " + r[4])
    for name, n, first in warnings_in_logs(args.logs):
        print(f"  {name}: {n} WARN/ERROR lines, first: {first[0].strip()[:300]}")
    failed = [r for r in ROWS if r[4] == "FAIL"]
    print(f"\n  targets: {sum(r[4] == 'PASS' for r in ROWS)} PASS, {len(failed)} FAIL")
    return 1 if failed else 0

"""Phase 3, a node SIGKILLed under traffic through two ingresses (failed requests; how long
until the ingresses stop listing its replicas as available), then another SIGTERMed (0 failed)."""

import signal
import subprocess
import time

from cluster_bench.report import ms, row, say, section, utc_now
from cluster_bench.servers import LEASE_TTL_S, Bench, bench_errors
from cluster_bench.watch import NodeWatch, Poller, run_jobs


def run(args, cl):
    section(f"3. node loss under traffic: {len(cl.nodes)} nodes, Zipf over 16 models through 2 "
            f"ingresses (concurrency 8 each), {args.secs:g} s per run, lease TTL {LEASE_TTL_S} s")
    pollers = [Poller(i) for i in cl.ingresses]
    for p in pollers:
        p.start()
    for n, (victim, sig) in enumerate(((cl.nodes[0], signal.SIGKILL),
                                       (cl.nodes[1], signal.SIGTERM))):
        name = signal.Signals(sig).name
        cl.wait_routes()
        node_id = victim.name.split("-", 1)[1]
        benches = [Bench(args.bin, i.url, 16, "k", 8, args.secs, seed=10 + 2 * n + k)
                   for k, i in enumerate(cl.ingresses[:2])]
        time.sleep(args.secs / 3)
        victim.signal(sig)
        at = utc_now()
        watches = {}

        def make(p, node_id=node_id, watches=watches):
            watches[p] = NodeWatch(node_id, time.perf_counter())
            return watches[p]

        # Polled every 5 ms: the ingresses are busy with traffic, on the same cores.
        _, gone = run_jobs(pollers, make, 20.0, 0.005)
        try:
            code = victim.proc.wait(20)
        except subprocess.TimeoutExpired:
            code = "still running after 20 s"
        results = [b.result() for b in benches]
        first = [watches[p].first for p in pollers]
        unavailable = [watches[p].unavailable for p in pollers]
        flaps = sum(watches[p].flaps for p in pollers)
        say(f"{name} {victim.name} at {at} (exit {code}); per ingress ({', '.join(i.name for i in cl.ingresses)}; "
            f"the last one has no traffic):")
        say(f"  none of its replicas listed available first after {', '.join(ms(u) for u in first)}; "
            f"for good after {', '.join(ms(u) for u in unavailable)} (came back as available "
            f"{flaps} times in between); no longer listed after {', '.join(ms(g) for g in gone)}")
        failed, worst = 0, 0.0
        for i, r in zip(cl.ingresses, results, strict=False):
            say(f"  traffic via {i.name}: " + (r["error"] if "error" in r else
                f"{r['requests_per_second']:.0f} req/s, p99 {r['latency_ms']['p99']:.1f} ms, "
                f"max {r['latency_ms']['max']:.0f} ms, {bench_errors(r)}"))
            failed += r.get("errors", 10**9)
            if "latency_ms" in r:
                worst = max(worst, r["latency_ms"]["max"])
        sent = sum(r.get("requests", 0) for r in results)
        def first_last(values):
            known = [u for u in values if u is not None]
            return (min(known) if known else None,
                    max(known) if known and len(known) == len(values) else None)

        label = "SIGKILL" if sig == signal.SIGKILL else "SIGTERM"
        if sig == signal.SIGKILL:
            row("3 node loss", f"{label}: failed requests", f"{failed} of {sent}")
        else:
            row("3 node loss", f"{label}: failed requests", f"{failed} of {sent}", "0", failed == 0)
        row("3 node loss", f"{label}: slowest request", f"{worst:.0f} ms")
        a, b = first_last(first)
        row("3 node loss", f"{label}: first / last ingress lists it unavailable",
            f"{ms(a)} / {ms(b)}")
        a, b = first_last(unavailable)
        row("3 node loss", f"{label}: ... for good (first / last ingress)",
            f"{ms(a)} / {ms(b)}{f' ({flaps} flaps)' if flaps else ''}")
        row("3 node loss", f"{label}: last ingress drops its records",
            ms(max(gone) if None not in gone else None))
        cl.nodes.remove(victim)
    for p in pollers:
        p.jobs.put(None)

"""Phase 5, etcd writes per second per node under Zipf traffic over 64 models."""

import time

from cluster_bench.report import row, say, section
from cluster_bench.servers import Bench, bench_errors, clear_caches, model_counters


def run(args, cl):
    secs = 2 * args.secs
    section(f"5. etcd writes under Zipf(1.1) traffic over 64 models, through "
            f"{len(cl.ingresses[:2])} ingresses (concurrency 8 each), {secs:g} s")
    clear_caches(cl.nodes)
    before, loads_before = cl.etcd.counters(), model_counters(cl.nodes)
    t = time.monotonic()
    benches = [Bench(args.bin, i.url, 64, "z", 8, secs, seed=k + 1)
               for k, i in enumerate(cl.ingresses[:2])]
    results = [b.result() for b in benches]
    elapsed = time.monotonic() - t
    after, loads_after = cl.etcd.counters(), model_counters(cl.nodes)
    for i, r in zip(cl.ingresses, results, strict=False):
        if "error" in r:
            say(f"via {i.name}: {r['error']}")
        else:
            say(f"via {i.name}: {r['requests_per_second']:.0f} req/s, p99 "
                f"{r['latency_ms']['p99']:.1f} ms, {bench_errors(r)}")
    puts, deletes = after["put"] - before["put"], after["delete"] - before["delete"]
    revs = after["revision"] - before["revision"]
    loads = loads_after["loads"] - loads_before["loads"]
    evictions = loads_after["evictions"] - loads_before["evictions"]
    writes = puts + deletes
    nodes = len(cl.nodes)
    per_node = writes / elapsed / nodes
    say(f"etcd: {puts:.0f} puts + {deletes:.0f} deletes ({revs} revisions) in {elapsed:.1f} s; "
        f"the nodes did {loads:.0f} loads and {evictions:.0f} evictions "
        f"({writes / max(loads, 1):.2f} writes per load)")
    say(f"{writes / elapsed:.1f} writes/s in all, {per_node:.1f} per node ({nodes} nodes; "
        f"ingresses write only their node record, at join)")
    row("5 etcd writes", "writes/s per node (puts+deletes)", f"{per_node:.1f}")
    row("5 etcd writes", "writes per model load", f"{writes / max(loads, 1):.2f}")

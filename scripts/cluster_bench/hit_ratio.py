"""Phase 6, the hit ratio of the cluster (through one ingress) against one process with the
same replicas and caps, on the same request sequence, with bench's offline LRU and optimum."""

import os
import signal

from cluster_bench.report import row, say, section
from cluster_bench.servers import (
    MODELS_PER_REPLICA,
    REPLICAS_PER_NODE,
    Bench,
    Server,
    bench_errors,
    clear_caches,
    config_yaml,
    model_counters,
)


def run(args, cl):
    slots = REPLICAS_PER_NODE * MODELS_PER_REPLICA * len(cl.nodes)
    section(f"6. hit ratio on the same sequence (seed 1, Zipf 1.1, 64 models, concurrency 16, "
            f"{args.secs:g} s): cluster through one ingress vs one process, {slots} slots each")
    clear_caches(cl.nodes)
    before = model_counters(cl.nodes)
    r = Bench(args.bin, cl.ingresses[0].url, 64, "z", 16, args.secs, seed=1,
              lru_slots=slots).result()
    after = model_counters(cl.nodes)
    if "error" in r:
        raise RuntimeError(f"bench through {cl.ingresses[0].name}: {r['error']}")
    delta = {k: after[k] - before[k] for k in after}
    cluster_hit = 1 - delta["loads"] / max(r["requests"], 1)
    say(f"cluster: {r['requests']} requests ({r['requests_per_second']:.0f}/s, {bench_errors(r)}), "
        f"{delta['loads']:.0f} loads on the nodes: hit ratio {cluster_hit:.3f}; offline LRU "
        f"{r['global_lru']['hit_ratio']:.3f}, optimal {r['global_optimal']['hit_ratio']:.3f}")
    if r.get("server"):
        say(f"(bench's own 'server' figures read the ingress's /metrics: loads "
            f"{r['server']['loads']:.0f}, hit ratio {r['server']['hit_ratio']:.3f})")
    config = os.path.join(args.logs, "single.yaml")
    with open(config, "w") as f:
        f.write(config_yaml(slots // MODELS_PER_REPLICA, False))
    single = Server(args.bin, config, "single", args.logs)
    before = model_counters([single])
    s = Bench(args.bin, single.url, 64, "z", 16, args.secs, seed=1, lru_slots=slots).result()
    after = model_counters([single])
    single.signal(signal.SIGTERM)
    single.proc.wait(10)
    if "error" in s:
        raise RuntimeError(f"bench against one process: {s['error']}")
    single_hit = 1 - (after["loads"] - before["loads"]) / max(s["requests"], 1)
    say(f"single:  {s['requests']} requests ({s['requests_per_second']:.0f}/s, {bench_errors(s)}), "
        f"{after['loads'] - before['loads']:.0f} loads: hit ratio {single_hit:.3f}; offline LRU "
        f"{s['global_lru']['hit_ratio']:.3f}, optimal {s['global_optimal']['hit_ratio']:.3f}")
    row("6 hit ratio", "cluster (1 - loads/requests)", f"{cluster_hit:.3f}")
    row("6 hit ratio", "single process", f"{single_hit:.3f}")
    row("6 hit ratio", "offline LRU / optimal (cluster's sequence)",
        f"{r['global_lru']['hit_ratio']:.3f} / {r['global_optimal']['hit_ratio']:.3f}")
    row("6 hit ratio", "offline LRU / optimal (single's sequence)",
        f"{s['global_lru']['hit_ratio']:.3f} / {s['global_optimal']['hit_ratio']:.3f}")
    row("6 hit ratio", "requests/s cluster / single",
        f"{r['requests_per_second']:.0f} / {s['requests_per_second']:.0f}")

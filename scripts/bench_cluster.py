"""The driver of scripts/bench-cluster: cluster mode on loopback, measured. Standard library only.

It starts etcd members and `modelmux serve --cluster` processes (nodes, which run replicas,
and ingresses, which only route and forward), drives them through their admin API and
`modelmux bench`, and prints what it measured, with the targets:

1. placement convergence: a model loaded (then evicted) through one node's admin API, and the
   time until every ingress's /-/models lists it on a remote replica (then no longer);
   p99 of the slowest ingress <= 50 ms;
2. forwarding overhead: one warm model, `modelmux bench --concurrency 1` against the node
   holding it and through an ingress; the ingress adds <= 0.5 ms at p50;
3. a node SIGKILLed under traffic through two ingresses (failed requests; how long until the
   ingresses stop listing its replicas as available), then another SIGTERMed (0 failed);
4. the etcd leader SIGKILLed under traffic (3 members): 0 failed requests;
5. etcd writes per second per node under Zipf traffic over 64 models;
6. the hit ratio of the cluster (through one ingress) against one process with the same
   replicas and caps, on the same request sequence, with bench's offline LRU and optimum.

Every child process is started from the main thread with PR_SET_PDEATHSIG, so none outlives
the driver, and all are stopped on exit. Logs: <logs>/<process>.log.
"""

import argparse
import atexit
import os
import shutil
import signal
import sys
import time

from cluster_bench import convergence, etcd_writes, forwarding, hit_ratio, leader_kill, node_loss
from cluster_bench.etcd import Etcd, stop_children_of
from cluster_bench.procs import on_signal, stop_children
from cluster_bench.report import print_summary, row
from cluster_bench.servers import LOAD_MS, MODELS_PER_REPLICA, REPLICAS_PER_NODE, Cluster


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True)
    parser.add_argument("--etcd", default="etcd")
    parser.add_argument("--secs", type=float, default=10)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--logs", default="target/bench-cluster")
    args = parser.parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    atexit.register(stop_children)
    shutil.rmtree(args.logs, ignore_errors=True)
    os.makedirs(args.logs)
    started = time.monotonic()
    status = 1
    try:
        # Phases 1, 2, 5, 6 and then 3 on one cluster: 1 etcd member, 2 nodes (a third joins
        # for phase 3), 3 ingresses.
        etcd = Etcd(args.etcd, 1, args.logs, "m")
        try:
            cl = Cluster(args, etcd, "main")
            cl.start("n1", "node")
            cl.start("n2", "node")
            for k in range(3):
                cl.start(f"i{k + 1}", "ingress")
            cl.wait_routes()
            print(f"cluster: etcd {etcd.members[0]['client']}; nodes "
                  + ", ".join(f"{n.name} {n.url}" for n in cl.nodes) + "; ingresses "
                  + ", ".join(f"{i.name} {i.url}" for i in cl.ingresses)
                  + f"; {REPLICAS_PER_NODE} replicas x {MODELS_PER_REPLICA} models per node, "
                  f"{LOAD_MS} ms loads", flush=True)
            convergence.run(args, cl)
            forwarding.run(args, cl)
            etcd_writes.run(args, cl)
            hit_ratio.run(args, cl)
            cl.start("n3", "node")
            node_loss.run(args, cl)
        finally:
            stop_children_of(etcd)
        leader_kill.run(args)
    except Exception as e:  # a phase that broke: report it with what was measured so far
        import traceback
        traceback.print_exc()
        row("error", type(e).__name__, str(e)[:120], "", False)
    except SystemExit:
        row("error", "interrupted", "the summary holds only what was measured", "", False)
        raise
    finally:
        status = print_summary(args, started)
    return status


if __name__ == "__main__":
    sys.exit(main())

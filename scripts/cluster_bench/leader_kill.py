"""Phase 4, the etcd leader SIGKILLed under traffic (3 members): 0 failed requests."""

import time

from cluster_bench.client import call
from cluster_bench.etcd import Etcd, stop_children_of
from cluster_bench.report import ms, row, say, section, utc_now
from cluster_bench.servers import Bench, Cluster, bench_errors, remote_with, wait_until


def run(args):
    section(f"4. etcd leader SIGKILLed under traffic: 3 members, 2 nodes, 1 ingress, Zipf over 16 "
            f"models (concurrency 8), {args.secs:g} s")
    etcd = Etcd(args.etcd, 3, args.logs, "e")
    try:
        cl = Cluster(args, etcd, "leader")
        cl.start("n1", "node")
        cl.start("n2", "node")
        ingress = cl.start("i1", "ingress")
        cl.wait_routes()
        bench = Bench(args.bin, ingress.url, 16, "k", 8, args.secs, seed=7)
        time.sleep(args.secs / 3)
        leader = etcd.leader()
        if leader is None:
            raise RuntimeError("no etcd leader to kill")
        leader_id = etcd.status(leader)[0]
        t, at = time.perf_counter(), utc_now()
        leader["proc"].kill()
        leader["proc"].wait()
        new = etcd.wait_leader(10, not_id=leader_id)
        elected = time.perf_counter() - t
        r = bench.result()
        say(f"killed leader {leader['name']} at {at}; a new leader ({new}) after {ms(elected)}")
        say("traffic via i1: " + (r["error"] if "error" in r else
            f"{r['requests_per_second']:.0f} req/s, p99 {r['latency_ms']['p99']:.1f} ms, "
            f"max {r['latency_ms']['max']:.0f} ms, {bench_errors(r)}"))
        # Still coordinated after the failover: a new load reaches the ingress.
        status, body = cl.nodes[0].load("after-failover")
        t = time.perf_counter()
        try:
            wait_until("the ingress to see a load made after the failover",
                       lambda: remote_with(ingress.models(), "after-failover"), 10, 0.002)
            seen = time.perf_counter() - t
        except RuntimeError:
            seen = None
        health = {s.name: call(s.url, path="/-/healthz")[0] for s in cl.nodes + cl.ingresses}
        say(f"after the failover: a load (status {status}) reached the ingress in {ms(seen)}; "
            f"/-/healthz: {health}")
        failed = r.get("errors", 10**9)
        row("4 etcd leader kill", "failed requests", f"{failed} of {r.get('requests', 0)}", "0",
            failed == 0)
        row("4 etcd leader kill", "new leader elected after", ms(elected))
        row("4 etcd leader kill", "a load after failover reaches the ingress", ms(seen))
    finally:
        stop_children_of(etcd)

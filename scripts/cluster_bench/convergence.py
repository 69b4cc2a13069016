"""Phase 1, placement convergence: a model loaded (then evicted) through one node's admin API,
and the time until every ingress's /-/models lists it on a remote replica (then no longer);
p99 of the slowest ingress <= 50 ms."""

import tempfile
import time

from cluster_bench.client import Conn
from cluster_bench.procs import ETCD_DATA_DIR
from cluster_bench.report import ms, pct, row, say, section
from cluster_bench.watch import CopyWatch, Poller, check_absent, check_present, run_jobs


def run(args, cl):
    section(f"1. placement convergence: {args.iterations} loads and evictions through a node's "
            f"admin API, {len(cl.ingresses)} ingresses polled")
    # The resolution: one /-/models round trip on an idle ingress.
    probe = Conn(cl.ingresses[0].url)
    idle = []
    for _ in range(200):
        a = time.perf_counter()
        probe.request("GET", "/-/models")
        idle.append(time.perf_counter() - a)
    probe.close()
    watch = CopyWatch(cl.etcd.members[0]["client"], "modelmux/bench/copies/")
    watch.start()
    watch.ready.wait(10)
    pollers = [Poller(i) for i in cl.ingresses]
    for p in pollers:
        p.start()
    # Per round: (t0, the slowest ingress's delay), to split with the etcd watch's times.
    rounds = {"loaded": [], "deleted": []}
    etcd_before = cl.etcd.counters()
    load_max, load_each, evict_max, evict_each = [], [], [], []
    load_lost = evict_lost = refused = 0
    worst_rounds = []

    def observe(kind, i, node, model, call, seen, rounds_of, each, worst):
        """One admin call on `node`, then the delay until every ingress shows it (`seen`).
        Returns (answered 200, ingresses that did not show it within 2 s)."""
        nonlocal refused
        status, body = call(model)
        if status != 200:
            refused += 1
            say(f"{kind} {model} on {node.name}: {status} {body[:200]!r}")
            return False, 0
        t0, delays = run_jobs(pollers, lambda _p: seen(model), 2.0)
        rounds_of.append((model, t0, None if None in delays else max(delays)))
        each += [d for d in delays if d is not None]
        if None not in delays:
            worst.append(max(delays))
            worst_rounds.append((max(delays), i, kind))
        return True, sum(d is None for d in delays)

    started = time.perf_counter()
    for i in range(args.iterations):
        node = cl.nodes[i % len(cl.nodes)]
        model = f"conv-{i}"
        ok, lost = observe("load", i, node, model, node.load, check_present, rounds["loaded"],
                           load_each, load_max)
        load_lost += lost
        if not ok:
            continue
        _, lost = observe("evict", i, node, model, node.evict, check_absent, rounds["deleted"],
                          evict_each, evict_max)
        evict_lost += lost
    elapsed = time.perf_counter() - started
    etcd_after = cl.etcd.counters()
    round_trips = [t for p in pollers for t in p.round_trips]
    for p in pollers:
        p.jobs.put(None)
    for p in pollers:
        p.join()
    fsyncs = etcd_after["fsyncs"] - etcd_before["fsyncs"]
    fsync_ms = (etcd_after["fsync_s"] - etcd_before["fsync_s"]) / max(fsyncs, 1) * 1e3
    say(f"{args.iterations} rounds in {elapsed:.1f} s; {sum(p.polls for p in pollers)} polls; "
        f"admin calls refused: {refused}; etcd: "
        f"{etcd_after['revision'] - etcd_before['revision']} writes, WAL fsync {fsync_ms:.2f} ms "
        f"on average (its data is in {ETCD_DATA_DIR or tempfile.gettempdir()})")
    say(f"/-/models round trip: idle (one client) p50 {ms(pct(idle, .5))} p99 {ms(pct(idle, .99))}; "
        f"while {len(pollers)} threads poll p50 {ms(pct(round_trips, .5))} "
        f"p99 {ms(pct(round_trips, .99))} (the resolution of every delay below)")
    for what, each, worst, lost in (("load ", load_each, load_max, load_lost),
                                    ("evict", evict_each, evict_max, evict_lost)):
        say(f"{what}: any ingress p50 {ms(pct(each, .5))} p99 {ms(pct(each, .99))}; slowest "
            f"ingress p50 {ms(pct(worst, .5))} p99 {ms(pct(worst, .99))} max "
            f"{ms(max(worst) if worst else None)}; not seen within 2 s: {lost}")
    p99 = pct(load_max, .99)
    row("1 convergence", "load seen by every ingress, p50", ms(pct(load_max, .5)))
    row("1 convergence", "load seen by every ingress, p99", ms(p99), "<= 50 ms",
        p99 is not None and p99 <= 0.050 and load_lost == 0)
    # The node's part: from the admin call's answer until the etcd watch got the write
    # (negative: written before the answer); the ingresses': from there until the last one
    # listed it (this includes polling; a delivery of the watch event to this process later
    # than the ingresses' can make it slightly negative).
    split = {}
    for kind, label in (("loaded", "load "), ("deleted", "evict")):
        node_part, ingress_part = [], []
        for model, t0, worst in rounds[kind]:
            t = watch.seen.get((model, kind))
            if t is None or worst is None:
                continue
            node_part.append(t - t0)
            ingress_part.append(t0 + worst - t)
            split[(model, kind)] = (t - t0, t0 + worst - t)
        say(f"{label}: node until etcd has it p50 {ms(pct(node_part, .5))} p99 "
            f"{ms(pct(node_part, .99))} max {ms(max(node_part) if node_part else None)}; "
            f"etcd until the last ingress lists it p50 {ms(pct(ingress_part, .5))} p99 "
            f"{ms(pct(ingress_part, .99))} max {ms(max(ingress_part) if ingress_part else None)}")
    worst = sorted(worst_rounds, reverse=True)[:5]
    say("slowest rounds (slowest ingress = node part + ingress part): " + ", ".join(
        f"{what} #{i} {ms(d)} = {' + '.join(ms(x) for x in split.get((f'conv-{i}', 'loaded' if what == 'load' else 'deleted'), (None, None)))}"
        for d, i, what in worst))
    e99 = pct(evict_max, .99)
    row("1 convergence", "eviction seen by every ingress, p50", ms(pct(evict_max, .5)))
    row("1 convergence", "eviction seen by every ingress, p99", ms(e99), "<= 50 ms (same)",
        e99 is not None and e99 <= 0.050 and evict_lost == 0)
    row("1 convergence", "/-/models poll round trip p50 idle / polling",
        f"{ms(pct(idle, .5))} / {ms(pct(round_trips, .5))}")

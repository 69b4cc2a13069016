"""Phase 2, forwarding overhead: one warm model, `modelmux bench --concurrency 1` against the
node holding it and through an ingress; the ingress adds <= 0.5 ms at p50."""

from cluster_bench.client import call
from cluster_bench.report import row, say, section
from cluster_bench.servers import Bench, remote_with, wait_until


def run(args, cl):
    section("2. forwarding overhead: one warm model, concurrency 1, 5 s each, node direct vs "
            "through an ingress")
    node, ingress = cl.nodes[0], cl.ingresses[0]
    model = "warm-0"
    status, body = node.load(model)
    if status != 200:
        raise RuntimeError(f"load {model}: {status} {body!r}")
    wait_until(f"{ingress.name} to see {model}",
               lambda: remote_with(ingress.models(), model), 10, 0.005)
    _, headers, _ = call(ingress.url, headers={"serve_multiplexed_model_id": model})
    say(f"through {ingress.name} the request is served by {headers.get('x-modelmux-replica')} "
        f"(the model is on {node.name})")
    results = {}
    for name, url in (("direct", node.url), ("ingress", ingress.url)):
        Bench(args.bin, url, 1, "warm-", 1, 1).result()  # warm-up: connections, allocator
        r = Bench(args.bin, url, 1, "warm-", 1, 5).result()
        if "error" in r:
            raise RuntimeError(f"bench against {name}: {r['error']}")
        results[name] = r
        lat = r["latency_ms"]
        say(f"{name:8} {r['requests_per_second']:7.0f} req/s  p50 {lat['p50']:.3f} ms  "
            f"p90 {lat['p90']:.3f}  p99 {lat['p99']:.3f}  errors {r['errors']}")
    d, i = results["direct"]["latency_ms"], results["ingress"]["latency_ms"]
    added50, added99 = i["p50"] - d["p50"], i["p99"] - d["p99"]
    say(f"added by the ingress: p50 {added50:+.3f} ms, p99 {added99:+.3f} ms")
    row("2 forwarding", "p50 direct / through ingress", f"{d['p50']:.3f} / {i['p50']:.3f} ms")
    row("2 forwarding", "p99 direct / through ingress", f"{d['p99']:.3f} / {i['p99']:.3f} ms")
    row("2 forwarding", "added p50", f"{added50:+.3f} ms", "<= 0.5 ms", added50 <= 0.5)
    row("2 forwarding", "added p99", f"{added99:+.3f} ms")

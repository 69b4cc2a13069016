"""`modelmux serve` processes (nodes, ingresses, one plain process), `modelmux bench` runs,
and what their /-/models and /metrics say."""

import http.client
import json
import os
import queue
import re
import subprocess
import threading
import time
import urllib.parse

from cluster_bench.client import Conn, metric_sum
from cluster_bench.procs import CHILDREN, LOG_LEVEL, die_with_parent, spawn, tail

DEPLOYMENT = "Model"
REPLICAS_PER_NODE = 2
MODELS_PER_REPLICA = 4
LOAD_MS = 20
LEASE_TTL_S = 3


def config_yaml(replicas, cluster):
    text = """http_options:
  host: 127.0.0.1
  port: 0
  trust_local_users: true
"""
    if cluster:
        text += f"""cluster:
  name: bench
  lease_ttl_s: {LEASE_TTL_S}
"""
    text += f"""applications:
  - name: default
    route_prefix: /
    deployments:
      - name: {DEPLOYMENT}
        num_replicas: {replicas}
        max_ongoing_requests: 8
        max_models_per_replica: {MODELS_PER_REPLICA}
        model: {{kind: synthetic, load_ms: {LOAD_MS}, size_mb: 1, infer_ms: 1}}
"""
    return text


class Server:
    """One `modelmux serve` process; its URL is parsed from its first stdout line."""

    def __init__(self, bin_, config, name, logs, extra=()):
        self.name = name
        self.log = os.path.join(logs, f"{name}.log")
        argv = [bin_, "serve", config, "--log-level", LOG_LEVEL, *extra]
        self.proc = spawn(argv, self.log, stdout=subprocess.PIPE)
        self.lines = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            line = self.lines.get(timeout=60)
        except queue.Empty:
            line = None
        m = re.search(r" on (http://\S+)\s*$", line or "")
        if not m:
            raise RuntimeError(f"{name} did not start (first line {line!r}); log {self.log}:\n"
                               + tail(self.log))
        self.url = m.group(1)
        self.admin = Conn(self.url)

    def _drain(self):
        for raw in self.proc.stdout:
            self.lines.put(raw.decode(errors="replace"))
        self.lines.put(None)

    def models(self):
        status, body = self.admin.request("GET", "/-/models")
        if status != 200:
            raise RuntimeError(f"{self.name} GET /-/models: {status} {body[:300]!r}")
        return json.loads(body)

    def metrics(self):
        status, body = self.admin.request("GET", "/metrics")
        return body.decode()

    def load(self, model):
        return self.admin.request("POST", f"/-/models/{DEPLOYMENT}/{model}/load",
                                  {"Content-Type": "application/json"})

    def evict(self, model):
        return self.admin.request("DELETE", f"/-/models/{DEPLOYMENT}/{model}",
                                  {"Content-Type": "application/json"})

    def signal(self, sig):
        self.proc.send_signal(sig)


class Cluster:
    def __init__(self, args, etcd, tag):
        self.args, self.etcd, self.tag = args, etcd, tag
        self.config = os.path.join(args.logs, "cluster.yaml")
        with open(self.config, "w") as f:
            f.write(config_yaml(REPLICAS_PER_NODE, True))
        self.nodes, self.ingresses = [], []

    def start(self, node_id, role):
        s = Server(self.args.bin, self.config, f"{self.tag}-{node_id}", self.args.logs,
                   ["--cluster", self.etcd.cluster_url(), "--node-id", node_id, "--role", role])
        (self.nodes if role == "node" else self.ingresses).append(s)
        return s

    def wait_routes(self, ingresses=None, within=30):
        want = REPLICAS_PER_NODE * len([n for n in self.nodes if n.proc.poll() is None])
        for i in ingresses or self.ingresses:
            wait_until(f"{i.name} to route to {want} replicas",
                       lambda i=i: available_remotes(i.models()) == want, within)


class Bench:
    """`modelmux bench --json` running in the background."""

    def __init__(self, bin_, url, models, prefix, concurrency, duration, seed=1, zipf=1.1,
                 lru_slots=None, timeout=10):
        argv = [bin_, "bench", "--url", url, "--models", str(models), "--model-prefix", prefix,
                "--zipf", str(zipf), "--concurrency", str(concurrency), "--duration",
                str(duration), "--seed", str(seed), "--timeout", str(timeout), "--json"]
        if lru_slots:
            argv += ["--lru-slots", str(lru_slots)]
        self.duration, self.timeout = duration, timeout
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=die_with_parent)
        CHILDREN.append(self.proc)

    def result(self):
        out, err = self.proc.communicate(timeout=self.duration + self.timeout + 60)
        if self.proc.returncode != 0:
            return {"error": err.decode(errors="replace").strip() or f"exit {self.proc.returncode}"}
        return json.loads(out)


def bench_errors(r):
    if "error" in r:
        return f"bench failed: {r['error']}"
    return f"{r['failed']} not 2xx + {r['transport_errors']} unanswered of {r['requests']}"


def replicas_of(doc):
    for app in doc.get("applications", []):
        for d in app.get("deployments", []):
            yield from d.get("replicas", [])


def remote_with(doc, model, lists=("loaded",)):
    """Whether a remote replica lists model in one of `lists` (loaded: [{id}], loading: [id])."""
    for r in replicas_of(doc):
        if not r.get("remote"):
            continue
        for key in lists:
            for m in r.get(key, []):
                if (m.get("id") if isinstance(m, dict) else m) == model:
                    return True
    return False


def available_remotes(doc, node=None):
    return sum(1 for r in replicas_of(doc)
               if r.get("remote") and r.get("available") and (node is None or r.get("node") == node))


def listed_remotes(doc, node):
    return sum(1 for r in replicas_of(doc) if r.get("remote") and r.get("node") == node)


def wait_until(what, check, within=30, every=0.02):
    deadline = time.monotonic() + within
    while True:
        try:
            if check():
                return
        except (OSError, http.client.HTTPException, RuntimeError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {within} s waiting for {what}")
        time.sleep(every)


def clear_caches(nodes):
    """Evicts every model of the nodes' own replicas, until none holds or loads any."""
    def empty():
        held = 0
        for n in nodes:
            for r in replicas_of(n.models()):
                if r.get("remote"):
                    continue
                ids = [m["id"] for m in r.get("loaded", [])] + list(r.get("loading", []))
                held += len(ids)
                for model in ids:
                    n.evict(urllib.parse.quote(model, safe=""))
        return held == 0
    wait_until("the nodes to hold no model", empty, within=20, every=0.1)


def model_counters(servers):
    out = {"loads": 0.0, "hits": 0.0, "misses": 0.0, "evictions": 0.0}
    for s in servers:
        page = s.metrics()
        out["loads"] += metric_sum(page, "modelmux_model_loads_total")
        out["hits"] += metric_sum(page, "modelmux_cache_hits_total")
        out["misses"] += metric_sum(page, "modelmux_cache_misses_total")
        out["evictions"] += metric_sum(page, "modelmux_model_evictions_total")
    return out

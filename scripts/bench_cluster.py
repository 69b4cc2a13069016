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
import base64
import ctypes
import http.client
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
CHILDREN = []
DEPLOYMENT = "Model"
REPLICAS_PER_NODE = 2
MODELS_PER_REPLICA = 4
LOAD_MS = 20
LEASE_TTL_S = 3
# Servers log warnings and the cluster's own info lines (lease lost, watch restarted), not a
# line per load or request: under Zipf traffic those are thousands a second, written to a file
# synchronously, and a slow disk then stalls the server. MODELMUX_LOG_LEVEL overrides it (say
# `info`, to see every load and every request's replica, status and time).
LOG_LEVEL = os.environ.get("MODELMUX_LOG_LEVEL", "warn,modelmux_cluster=info")
# etcd's data: a tmpfs by default, so that its fsyncs time this machine's memory, not a disk
# shared with whatever else runs here (builds); ETCD_DATA_DIR=dir puts it elsewhere.
ETCD_DATA_DIR = os.environ.get("ETCD_DATA_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else None)


def die_with_parent():
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(argv, log_path, stdout=subprocess.DEVNULL):
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=log, preexec_fn=die_with_parent
        )
    CHILDREN.append(proc)
    return proc


def stop_children(keep=()):
    """SIGTERM every child still running (but those in `keep`), then SIGKILL what is left
    after 3 s."""
    alive = [p for p in CHILDREN if p.poll() is None and p not in keep]
    for p in alive:
        try:
            p.terminate()
        except OSError:
            pass
    deadline = time.monotonic() + 3
    for p in alive:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_port(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def pct(values, q):
    """The q-quantile (0..1) of values, nearest rank; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def utc_now():
    """The time now as the servers' logs print it (UTC), to find an event in them."""
    return time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1000):03d}Z"


def ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def call(url, method="GET", path="/", headers=None, body=None, timeout=10):
    """One request on a new connection: (status, {header: value}, body)."""
    host, port = host_port(url)
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


class Conn:
    """A kept-alive HTTP/1.1 connection that reconnects when the server closed it."""

    def __init__(self, url, timeout=10):
        self.host, self.port = host_port(url)
        self.timeout = timeout
        self.c = None

    def request(self, method, path, headers=None, body=None):
        for attempt in (0, 1):
            if self.c is None:
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.c.request(method, path, body=body, headers=headers or {})
                r = self.c.getresponse()
                data = r.read()
                if r.will_close:
                    self.c.close()
                    self.c = None
                return r.status, data
            except (http.client.HTTPException, OSError):
                self.c.close()
                self.c = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self):
        if self.c is not None:
            self.c.close()
            self.c = None


# ---------------------------------------------------------------------------------- etcd


class Etcd:
    """`members` etcd members on free loopback ports, data in a temporary directory."""

    def __init__(self, binary, members, logs, tag):
        self.dir = tempfile.mkdtemp(prefix="bench-cluster-etcd-", dir=ETCD_DATA_DIR)
        atexit.register(shutil.rmtree, self.dir, True)
        specs = [
            (f"{tag}{i}", f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
            for i in range(members)
        ]
        initial = ",".join(f"{n}={peer}" for n, _, peer in specs)
        self.members = []
        for name, client, peer in specs:
            argv = [binary, "--name", name, "--data-dir", os.path.join(self.dir, name),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--heartbeat-interval", "50", "--election-timeout", "500"]
            proc = spawn(argv, os.path.join(logs, f"etcd-{name}.log"))
            self.members.append({"name": name, "client": client, "proc": proc})
        self.wait_leader(30)

    def cluster_url(self):
        return "etcd://" + ",".join(m["client"].removeprefix("http://") for m in self.members)

    def alive(self):
        return [m for m in self.members if m["proc"].poll() is None]

    @staticmethod
    def status(member):
        """etcd's Maintenance.Status through its JSON gateway: (member id, leader id, revision)."""
        status, _, body = call(member["client"], "POST", "/v3/maintenance/status", body=b"{}",
                               headers={"Content-Type": "application/json"}, timeout=2)
        if status != 200:
            raise RuntimeError(f"status of {member['name']}: {status} {body[:200]!r}")
        s = json.loads(body)
        return s["header"]["member_id"], s.get("leader", "0"), int(s["header"].get("revision", 0))

    def leader(self):
        """The member leading now, if a live member knows."""
        ids = {}
        leader = None
        for m in self.alive():
            try:
                member_id, lead, _ = self.status(m)
            except (OSError, RuntimeError, KeyError, ValueError):
                continue
            ids[member_id] = m
            if lead and lead != "0":
                leader = lead
        return ids.get(leader) if leader else None

    def wait_leader(self, within, not_id=None):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for m in self.alive():
                try:
                    member_id, lead, _ = self.status(m)
                except (OSError, RuntimeError, KeyError, ValueError):
                    continue
                if lead and lead != "0" and lead != not_id:
                    return lead
            time.sleep(0.01)
        raise RuntimeError(f"etcd has no leader after {within} s")

    def counters(self, member=None):
        """Writes seen by one member: {put, delete, revision} (etcd_mvcc_* and the revision)."""
        m = member or self.alive()[0]
        _, _, page = call(m["client"], "GET", "/metrics")
        page = page.decode()
        out = {"put": metric_sum(page, "etcd_mvcc_put_total"),
               "delete": metric_sum(page, "etcd_mvcc_delete_total"),
               "txn": metric_sum(page, "etcd_mvcc_txn_total"),
               "fsync_s": metric_sum(page, "etcd_disk_wal_fsync_duration_seconds_sum"),
               "fsyncs": metric_sum(page, "etcd_disk_wal_fsync_duration_seconds_count")}
        out["revision"] = self.status(m)[2]
        return out

    def close(self):
        for m in self.members:
            if m["proc"].poll() is None:
                m["proc"].kill()
                m["proc"].wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def metric_sum(page, name):
    """The sum of every series of one metric in a Prometheus text page."""
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            rest = line[len(name):]
            if rest.startswith("{"):
                rest = rest[rest.rfind("}") + 1:]
            total += float(rest.split()[0])
    return total


# ---------------------------------------------------------------------------------- modelmux


def config_yaml(replicas, cluster):
    text = f"""http_options:
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


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


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


# ---------------------------------------------------------------------------------- pollers


class CopyWatch(threading.Thread):
    """Watches the cluster's model copy keys through etcd's JSON gateway and notes when each
    event reached this process: {(model id, "loaded" | "deleted"): perf_counter time}. It
    splits a convergence delay into the publishing node's part (until etcd has the write)
    and the ingresses' part (from there until they list it)."""

    def __init__(self, etcd_client, prefix):
        super().__init__(daemon=True)
        self.host, self.port = host_port(etcd_client)
        self.prefix = prefix.encode()
        self.seen = {}
        self.ready = threading.Event()

    def run(self):
        end = self.prefix[:-1] + bytes([self.prefix[-1] + 1])
        b64 = lambda b: base64.b64encode(b).decode()
        c = http.client.HTTPConnection(self.host, self.port)
        c.request("POST", "/v3/watch", headers={"Content-Type": "application/json"},
                  body=json.dumps({"create_request": {"key": b64(self.prefix),
                                                      "range_end": b64(end)}}))
        r = c.getresponse()
        while line := r.readline():
            t = time.perf_counter()
            result = json.loads(line).get("result", {})
            if result.get("created"):
                self.ready.set()
            for ev in result.get("events", []):
                model = base64.b64decode(ev["kv"]["key"]).decode().rsplit("/", 1)[-1]
                if ev.get("type") == "DELETE":
                    self.seen.setdefault((model, "deleted"), t)
                    continue
                value = json.loads(base64.b64decode(ev["kv"].get("value", "")) or b"{}")
                if value.get("loaded"):
                    self.seen.setdefault((model, "loaded"), t)


class Poller(threading.Thread):
    """Polls one ingress's /-/models in a tight loop on a kept-alive connection, per job: a
    job is (check(body, t) -> done?, t0, deadline, pause between polls); its result is t - t0 at the poll that
    satisfied the check (the time the response arrived), or None at the deadline."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.server = server
        self.conn = Conn(server.url, timeout=5)
        self.jobs = queue.Queue()
        self.results = queue.Queue()
        self.round_trips = []
        self.polls = 0

    def run(self):
        while True:
            job = self.jobs.get()
            if job is None:
                self.conn.close()
                return
            check, t0, deadline, every = job
            result = None
            while True:
                a = time.perf_counter()
                try:
                    status, body = self.conn.request("GET", "/-/models")
                except (OSError, http.client.HTTPException):
                    status, body = 0, b""
                b = time.perf_counter()
                self.round_trips.append(b - a)
                self.polls += 1
                if status == 200 and check(body, b):
                    result = b - t0
                    break
                if b > deadline:
                    break
                if every:
                    time.sleep(every)
            self.results.put(result)


def run_jobs(pollers, make_check, within, every=0.0):
    """Gives every poller a job starting now (polls `every` s apart; 0: back to back);
    returns (t0, [delay or None per poller])."""
    t0 = time.perf_counter()
    for p in pollers:
        p.jobs.put((make_check(p), t0, t0 + within, every))
    return t0, [p.results.get() for p in pollers]


def check_present(model):
    key = f'"{model}"'.encode()
    return lambda body, _t: key in body and remote_with(json.loads(body), model)


def check_absent(model):
    key = f'"{model}"'.encode()
    return lambda body, _t: key not in body or not remote_with(
        json.loads(body), model, ("loaded", "loading"))


class NodeWatch:
    """For a node going away, as one ingress lists it: when none of its replicas is available
    first, from when none is for good (a replica marked unreachable after a failed forward
    comes back a moment later, until its records go), how many times one came back, and when
    none is listed at all."""

    def __init__(self, node, t0):
        self.node, self.t0 = node, t0
        self.first = None
        self.unavailable = None
        self.flaps = 0
        self.gone = None

    def __call__(self, body, t):
        doc = json.loads(body)
        up = available_remotes(doc, self.node)
        if up == 0 and self.unavailable is None:
            self.unavailable = t - self.t0
            if self.first is None:
                self.first = self.unavailable
        elif up and self.unavailable is not None:
            self.flaps += 1
            self.unavailable = None
        if listed_remotes(doc, self.node) == 0:
            self.gone = t - self.t0
            return True
        return False


# ---------------------------------------------------------------------------------- report

ROWS = []


def row(phase, metric, value, target="", ok=None):
    ROWS.append((phase, metric, value, target, "" if ok is None else ("PASS" if ok else "FAIL")))


def section(title):
    print(f"\n== {title}", flush=True)


def say(text):
    print(f"   {text}", flush=True)


# ---------------------------------------------------------------------------------- phases


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


def phase_convergence(args, cl):
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


def phase_forwarding(args, cl):
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


def phase_etcd_writes(args, cl):
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
    for i, r in zip(cl.ingresses, results):
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


def phase_hit_ratio(args, cl):
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


def phase_node_loss(args, cl):
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

        def make(p, node_id=node_id):
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
        for i, r in zip(cl.ingresses, results):
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


def phase_leader_kill(args):
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


def stop_children_of(etcd):
    """Stops the modelmux processes (they leave the cluster), then etcd."""
    stop_children(keep=[m["proc"] for m in etcd.members])
    etcd.close()


def warnings_in_logs(logs):
    out = []
    for name in sorted(os.listdir(logs)):
        if not name.endswith(".log") or name.startswith("etcd-"):
            continue
        lines = [l for l in open(os.path.join(logs, name), errors="replace")
                 if " WARN " in l or " ERROR " in l]
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
            phase_convergence(args, cl)
            phase_forwarding(args, cl)
            phase_etcd_writes(args, cl)
            phase_hit_ratio(args, cl)
            cl.start("n3", "node")
            phase_node_loss(args, cl)
        finally:
            stop_children_of(etcd)
        phase_leader_kill(args)
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

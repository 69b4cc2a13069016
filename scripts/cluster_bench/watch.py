"""Watching the cluster converge: etcd's copy keys as they change (CopyWatch), ingresses'
/-/models polled in tight loops (Poller, run_jobs), and what a poll looks for."""

import base64
import http.client
import json
import queue
import threading
import time

from cluster_bench.client import Conn, host_port
from cluster_bench.servers import available_remotes, listed_remotes, remote_with


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

        def b64(b):
            return base64.b64encode(b).decode()

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

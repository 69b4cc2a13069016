"""etcd members on free loopback ports, data in a temporary directory."""

import atexit
import json
import os
import shutil
import tempfile
import time

from cluster_bench.client import call, metric_sum
from cluster_bench.procs import ETCD_DATA_DIR, free_port, spawn, stop_children


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


def stop_children_of(etcd):
    """Stops the modelmux processes (they leave the cluster), then etcd."""
    stop_children(keep=[m["proc"] for m in etcd.members])
    etcd.close()

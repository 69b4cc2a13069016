"""The child processes: started from the main thread with PR_SET_PDEATHSIG, so none outlives
the driver, and all stopped on exit."""

import ctypes
import os
import signal
import socket
import subprocess
import time

LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
CHILDREN = []
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


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""

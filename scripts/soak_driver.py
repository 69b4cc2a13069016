"""The hostile and unlucky clients of scripts/soak, run for a while against one server, and the
checks made once they stop. Standard library only.

Clients, all at once (the Zipf traffic itself is `modelmux bench`, started by scripts/soak):
- bursts: every 20 s, 10x the steady connections at once, each sending one request;
- leavers: clients that ask for a cold model and hang up 20 ms later;
- slowloris: clients that send a request head one byte a second, and others that send a body
  one byte a second; the server must cut both off within its timeouts;
- admin: a model pinned, then unpinned, every few seconds;
- idle HTTP/2: connections that send the preface and SETTINGS, answer every ping and never
  open a stream; the server must close each after its keep-alive timeout;
- announced bodies: heads that promise the largest body and send none of it, while a probe
  posts small bodies that must never be refused for the body budget;
- random ids: requests for model ids drawn from 2^64, each new (their loads fail 10% of the
  time, and what the server remembers of failures must stay bounded: RSS is checked).

Then, with everything quiet: no replica advertises a model as loading, each replica's byte
gauge is what its resident models explain, the peak RSS is printed against the models' bytes,
every request a client sent got an answer, and the server still answers its health check.
Prints a report and exits 1 when a check fails.
"""

import asyncio
import json
import os
import random
import sys
import time

HOST = "127.0.0.1"


class Stats:
    """Counts per client kind: answers by status, requests never answered, and notes."""

    def __init__(self):
        self.answers = {}
        self.unanswered = {}
        self.notes = {}

    def answer(self, kind, status):
        key = f"{status // 100}xx" if status < 500 else str(status)
        bucket = self.answers.setdefault(kind, {})
        bucket[key] = bucket.get(key, 0) + 1

    def lost(self, kind, why):
        bucket = self.unanswered.setdefault(kind, {})
        bucket[why] = bucket.get(why, 0) + 1

    def note(self, kind, value):
        self.notes.setdefault(kind, []).append(value)


async def read_response(reader):
    """Reads one HTTP/1.1 response; returns (status, body)."""
    line = await reader.readline()
    if not line:
        raise EOFError("connection closed before a response")
    status = int(line.split()[1])
    length, chunked = 0, False
    while True:
        header = await reader.readline()
        if header in (b"\r\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if not chunked:
        return status, await reader.readexactly(length)
    body = b""
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, body
        body += chunk[:-2]


def request_bytes(method, path, headers=(), body=b""):
    head = [f"{method} {path} HTTP/1.1", f"Host: {HOST}"]
    head += [f"{k}: {v}" for k, v in headers]
    if body or method == "POST":
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def call(port, method, path, headers=(), body=b"", timeout=30.0):
    """One request on a new connection: (status, body). Raises on no answer."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
    try:
        writer.write(request_bytes(method, path, headers, body))
        await writer.drain()
        return await asyncio.wait_for(read_response(reader), timeout)
    finally:
        writer.close()


def zipf_ids(models, s, rng):
    weights = [1.0 / (k + 1) ** s for k in range(models)]
    return lambda: f"m{rng.choices(range(models), weights)[0]}"


async def bursts(port, until, size, pick, stats):
    async def one():
        try:
            status, _ = await call(port, "GET", "/", [("serve_multiplexed_model_id", pick())])
            stats.answer("burst", status)
        except ConnectionRefusedError:
            stats.note("burst_refused", 1)
        except (TimeoutError, EOFError, ConnectionError, asyncio.IncompleteReadError) as e:
            stats.lost("burst", type(e).__name__)

    while time.monotonic() < until - 5:
        await asyncio.sleep(20)
        if time.monotonic() >= until - 5:
            break
        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(size)))
        stats.note("burst_seconds", time.monotonic() - started)


async def leavers(port, until, stats, rng):
    """Ask for a cold model and hang up 20 ms later, about 20 times a second."""
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
            cold = f"cold-{rng.randrange(1_000_000)}"
            writer.write(request_bytes("GET", "/", [("serve_multiplexed_model_id", cold)]))
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.close()
            stats.note("leavers", 1)
        except (ConnectionError, OSError):
            stats.note("leaver_connect_failed", 1)
        await asyncio.sleep(0.05)


async def slow_head(port, until, stats):
    """Send a request head one byte a second; time how long the server keeps the connection."""
    head = request_bytes("GET", "/", [("serve_multiplexed_model_id", "m0")])
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except (ConnectionError, OSError):
            stats.note("slow_connect_failed", 1)
            await asyncio.sleep(1)
            continue
        try:
            for byte in head[:-4]:  # never the blank line that ends the head
                writer.write(bytes([byte]))
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                        break
                except TimeoutError:
                    pass
                if time.monotonic() - started > 60:
                    break
        except (ConnectionError, OSError):
            pass
        stats.note("slow_head_held_s", time.monotonic() - started)
        writer.close()


async def slow_body(port, until, stats):
    """Send a head promising 1000 bytes, then one byte a second: expect 408 in time."""
    head = request_bytes("POST", "/", [("serve_multiplexed_model_id", "m1")], b"")
    head = head.replace(b"Content-Length: 0", b"Content-Length: 1000")
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(head)
            await writer.drain()
            response = asyncio.ensure_future(read_response(reader))
            while not response.done() and time.monotonic() - started < 60:
                try:
                    writer.write(b"x")
                    await writer.drain()
                except (ConnectionError, OSError):
                    break
                await asyncio.wait([response], timeout=1.0)
            try:
                status, _ = await asyncio.wait_for(response, 5)
                stats.answer("slow_body", status)
            except (TimeoutError, EOFError, ConnectionError, asyncio.IncompleteReadError):
                stats.lost("slow_body", "no 408")
            stats.note("slow_body_held_s", time.monotonic() - started)
            writer.close()
        except (ConnectionError, OSError):
            stats.note("slow_connect_failed", 1)
            await asyncio.sleep(1)


async def admin(port, until, pick, stats):
    json_type = [("Content-Type", "application/json")]
    while time.monotonic() < until:
        model = pick()
        for path in (f"/-/models/Model/{model}/load?pin=true", f"/-/models/Model/{model}/unpin"):
            try:
                status, _ = await call(port, "POST", path, json_type, timeout=30)
                stats.answer("admin", status)
            except (TimeoutError, EOFError, ConnectionError) as e:
                stats.lost("admin", type(e).__name__)
            await asyncio.sleep(2)


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\x04\0\0\0\0\0"


async def idle_h2(port, until, stats):
    """An HTTP/2 connection that answers SETTINGS and PINGs and asks nothing; how long it is
    kept, and whether a GOAWAY came first."""
    while time.monotonic() < until:
        started = time.monotonic()
        writer, goaway = None, False
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(H2_PREFACE)
            await writer.drain()
            while time.monotonic() - started < 120:
                head = await asyncio.wait_for(reader.readexactly(9), 120)
                length = int.from_bytes(head[:3], "big")
                payload = await reader.readexactly(length)
                kind, ack = head[3], head[4] & 1
                if kind == 4 and not ack:
                    writer.write(b"\0\0\0\x04\x01\0\0\0\0")
                elif kind == 6 and not ack:
                    writer.write(b"\0\0\x08\x06\x01\0\0\0\0" + payload)
                elif kind == 7:
                    goaway = True
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        if writer is None:
            await asyncio.sleep(1)
            continue
        stats.note("idle_h2_held_s", time.monotonic() - started)
        stats.note("idle_h2_goaway", goaway)
        writer.close()


async def announced_bodies(port, until, max_body, stats):
    """Heads promising `max_body` bytes, and nothing after them, over and over."""
    head = request_bytes("POST", "/", [("serve_multiplexed_model_id", "m2")], b"")
    head = head.replace(b"Content-Length: 0", f"Content-Length: {max_body}".encode())
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(head)
            await writer.drain()
            try:
                await asyncio.wait_for(read_response(reader), 60)
            except (TimeoutError, EOFError, ConnectionError, asyncio.IncompleteReadError):
                pass
            writer.close()
        except (ConnectionError, OSError):
            await asyncio.sleep(1)


async def body_probe(port, until, stats):
    """A small body every half second: the announced bodies must not spend its budget."""
    while time.monotonic() < until:
        try:
            status, body = await call(port, "POST", "/", [("serve_multiplexed_model_id", "m3")], b"{}")
            stats.answer("body_probe", status)
            if b"body budget" in body or b"budget of" in body:
                stats.note("body_probe_refused_for_budget", 1)
        except (TimeoutError, EOFError, ConnectionError) as e:
            stats.lost("body_probe", type(e).__name__)
        await asyncio.sleep(0.5)


async def random_ids(port, until, stats, rng):
    """Requests for ids nobody asked for before, 20 a second."""
    while time.monotonic() < until:
        model = f"random-{rng.getrandbits(64):016x}"
        try:
            status, _ = await call(port, "GET", "/", [("serve_multiplexed_model_id", model)])
            stats.answer("random_ids", status)
        except (TimeoutError, EOFError, ConnectionError) as e:
            stats.lost("random_ids", type(e).__name__)
        await asyncio.sleep(0.05)


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


async def sample_rss(pid, until, stats):
    while time.monotonic() < until:
        stats.note("rss_kib", rss_kib(pid, "VmRSS"))
        await asyncio.sleep(1)


def metric_series(page, name):
    """{labels: value} of one metric family."""
    out = {}
    for line in page.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            out[labels[len(name):]] = float(value)
    return out


async def main():
    port, pid, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    steady, models_bytes, body_budget, conn_cap = (int(a) for a in sys.argv[4:8])
    header_timeout, body_timeout = float(sys.argv[8]), float(sys.argv[9])
    keep_alive, max_body = float(sys.argv[10]), int(sys.argv[11])
    rng = random.Random(7)
    pick = zipf_ids(64, 1.1, rng)
    stats = Stats()
    until = time.monotonic() + seconds
    _, before = await call(port, "GET", "/metrics")
    await asyncio.gather(
        bursts(port, until, 10 * steady, pick, stats),
        leavers(port, until, stats, rng),
        *(slow_head(port, until, stats) for _ in range(20)),
        *(slow_body(port, until, stats) for _ in range(5)),
        admin(port, until, pick, stats),
        *(idle_h2(port, until, stats) for _ in range(50)),
        *(announced_bodies(port, until, max_body, stats) for _ in range(4)),
        body_probe(port, until, stats),
        random_ids(port, until, stats, random.Random(11)),
        sample_rss(pid, until, stats),
    )
    # Let in-flight loads, unloads and drains finish.
    await asyncio.sleep(5)
    failures = []

    def check(ok, what):
        print(f"  [{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            failures.append(what)

    _, listing = await call(port, "GET", "/-/models")
    _, page = await call(port, "GET", "/metrics")
    page, before = page.decode(), before.decode()
    replicas = [
        r
        for app in json.loads(listing)["applications"]
        for d in app["deployments"]
        for r in d["replicas"]
    ]
    print("\n== checks")
    loading = [(r["id"], r["loading"]) for r in replicas if r["loading"]]
    gauge_loading = sum(metric_series(page, "modelmux_models_loading").values())
    check(not loading and gauge_loading == 0,
          f"no model advertised as loading once all is quiet (listed: {loading}, gauge: {gauge_loading:.0f})")
    gauges = metric_series(page, "modelmux_model_bytes")
    for r in replicas:
        explained = sum(m["size_bytes"] or 0 for m in r["loaded"])
        charged = [v for labels, v in gauges.items() if f'replica="{r["id"]}"' in labels]
        check(charged == [explained],
              f"replica {r['id']}: bytes charged {charged} = its {len(r['loaded'])} resident models' {explained}")
        check(r["ongoing_requests"] == 0, f"replica {r['id']}: no request still counted as ongoing ({r['ongoing_requests']})")
    peak_kib = rss_kib(pid, "VmHWM")
    rss = stats.notes.get("rss_kib", [0])
    quarter = rss[len(rss) // 4] if rss else 0
    bound_kib = (models_bytes + conn_cap * 64 * 1024 + body_budget) // 1024 + 128 * 1024
    print(f"  peak RSS {peak_kib / 1024:.0f} MiB against {models_bytes / 2**20:.0f} MiB of models at most "
          f"({peak_kib * 1024 / models_bytes:.2f}x); RSS a quarter in {quarter / 1024:.0f} MiB, at the end {rss[-1] / 1024:.0f} MiB")
    check(peak_kib <= bound_kib,
          f"peak RSS within models + connections x 64 KiB + body budget + 128 MiB ({bound_kib / 1024:.0f} MiB)")
    lost = {k: v for k, v in stats.unanswered.items() if v}
    check(not lost, f"every request a client finished sending was answered (unanswered: {lost})")
    heads = stats.notes.get("slow_head_held_s", [])
    check(bool(heads) and max(heads) < header_timeout + 3,
          f"slow heads cut off: {len(heads)} of them, longest held {max(heads, default=0):.1f} s "
          f"(header_read_timeout {header_timeout:.0f} s)")
    bodies = stats.notes.get("slow_body_held_s", [])
    slow_answers = stats.answers.get("slow_body", {})
    # 408 once the body is late, or 503 at once while a burst has the server shedding load.
    check(bool(bodies) and max(bodies) < body_timeout + 3 and set(slow_answers) <= {"4xx", "503"}
          and slow_answers.get("4xx", 0) > 0,
          f"slow bodies answered in time: {slow_answers}, longest {max(bodies, default=0):.1f} s "
          f"(body_read_timeout {body_timeout:.0f} s)")
    held = stats.notes.get("idle_h2_held_s", [])
    # The keep-alive timeout, a quarter of it more (the watchdog), and the GOAWAY's round trip.
    check(bool(held) and max(held) < keep_alive * 1.25 + 3 and all(stats.notes.get("idle_h2_goaway", [])),
          f"idle HTTP/2 connections closed with a GOAWAY: {len(held)} of them, longest held "
          f"{max(held, default=0):.1f} s (keep_alive_timeout {keep_alive:.0f} s)")
    refused = len(stats.notes.get("body_probe_refused_for_budget", []))
    check(refused == 0 and stats.answers.get("body_probe"),
          f"bodies announced and never sent spent no body budget ({refused} small bodies refused for it; "
          f"probe answers {stats.answers.get('body_probe', {})})")
    grown = (rss[-1] - quarter) / 1024 if rss else 0
    check(grown < 64, f"RSS from a quarter in to the end grew {grown:+.0f} MiB under "
          f"{sum(stats.answers.get('random_ids', {}).values())} requests for new random ids (at most +64 MiB)")
    status, body = await call(port, "GET", "/-/healthz")
    check(status == 200 and os.path.exists(f"/proc/{pid}"), f"the server is alive and healthy ({status} {body.decode()})")

    def delta(name):
        return sum(metric_series(page, name).values()) - sum(metric_series(before, name).values())

    print("\n== what happened")
    for kind, answers in sorted(stats.answers.items()):
        print(f"  {kind:10} answers {answers}")
    print(f"  bursts of {10 * steady}: {len(stats.notes.get('burst_seconds', []))}, "
          f"each answered in {max(stats.notes.get('burst_seconds', [0])):.1f} s at most; "
          f"connections refused: {len(stats.notes.get('burst_refused', []))}")
    print(f"  leavers: {len(stats.notes.get('leavers', []))} cold requests abandoned after 20 ms; "
          f"loads abandoned before they started: {delta('modelmux_model_loads_abandoned_total'):.0f}")
    print(f"  loads {delta('modelmux_model_loads_total'):.0f}, failed {delta('modelmux_model_load_failures_total'):.0f}, "
          f"evictions {delta('modelmux_model_evictions_total'):.0f}")
    print(f"\n{'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    sys.exit(1 if failures else 0)


asyncio.run(main())

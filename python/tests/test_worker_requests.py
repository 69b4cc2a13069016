"""The worker's HTTP handling: errors, streaming, request bodies, cancellation, start-up."""

import hashlib
import json
import os
import subprocess
import sys
import time
import unittest

from tests.peer import (
    APPS_DIR,
    BODY,
    CANCEL,
    CONTROL,
    END,
    ERROR,
    FATAL,
    READY,
    REQUEST_BODY,
    REQUEST_END,
    START,
    Peer,
    WorkerTestCase,
    worker_env,
)


class RequestsTest(WorkerTestCase):
    APP = "import:behaviors:entry"
    DEPLOYMENT = "Behaviors"
    PEER_OPTIONS = {"replica_id": "Behaviors#abc"}
    FIRST_STREAM = 100

    def test_ready_says_not_multiplexed(self):
        self.assertEqual(self.ready.head["multiplexed"], False)

    def test_plain_text(self):
        resp = self.peer.get(self.next_stream(), "/hi")
        self.assertEqual((resp.status, resp.body), (200, b"hello /hi"))
        self.assertEqual(resp.headers["content-type"], "text/plain; charset=utf-8")

    def test_exception_is_an_error_and_the_worker_carries_on(self):
        s = self.next_stream()
        self.peer.request(s, "/fail")
        frame = self.peer.next(stream=s)
        self.assertEqual(frame.type, ERROR)
        self.assertEqual(frame.head["type"], "KeyError")
        self.assertEqual(frame.head["message"], "'boom'")
        self.assertIn("behaviors.py", frame.head["traceback"])
        self.assertIn("KeyError: 'boom'", self.peer.log())
        self.assertEqual(self.peer.get(self.next_stream(), "/after").body, b"hello /after")

    def test_streaming_response_is_start_body_end(self):
        resp = self.peer.get(self.next_stream(), "/stream")
        self.assertEqual([f.type for f in resp.frames], [START, BODY, BODY, END])
        self.assertTrue(resp.frames[0].head["more"])
        self.assertEqual(resp.frames[0].data, b"chunk0;")
        self.assertEqual(resp.body, b"chunk0;chunk1;chunk2;")
        self.assertTrue(resp.headers["content-type"].startswith("text/plain"))

    def test_large_response_is_cut_into_chunks_of_one_mib(self):
        resp = self.peer.get(self.next_stream(), "/big")
        self.assertEqual(resp.body, bytes(range(256)) * (10 * 1024))
        self.assertEqual([f.type for f in resp.frames], [START, BODY, BODY, END])
        self.assertEqual([len(f.data) for f in resp.frames], [1 << 20, 1 << 20, 1 << 19, 0])

    def test_body_in_several_chunks_is_read_whole(self):
        parts = [b"a" * 700_000, b"b" * 700_000, b"c" * 5]
        s = self.next_stream()
        self.peer.request(s, "/echo", method="POST", body=parts[0], more=True)
        time.sleep(0.05)
        self.peer.send(REQUEST_BODY, s, None, parts[1])
        self.peer.send(REQUEST_BODY, s, None, parts[2])
        # Still waiting for the end.
        self.assertEqual(self.peer.frames_after_barrier(s, self.next_stream()), [])
        self.peer.send(REQUEST_END, s)
        body = json.loads(self.peer.response(s).body)
        whole = b"".join(parts)
        self.assertEqual(body, {"length": len(whole), "sha256": hashlib.sha256(whole).hexdigest()})

    def test_cancel_disconnects_and_cancels_the_task(self):
        s = self.next_stream()
        self.peer.request(s, "/wait")
        deadline = time.monotonic() + 10
        while "started" not in self.peer.out_file("wait") and time.monotonic() < deadline:
            time.sleep(0.02)
        self.peer.send(CANCEL, s)
        while "cancelled" not in self.peer.out_file("wait") and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertIn("cancelled http.disconnect", self.peer.out_file("wait"))
        self.assertEqual(self.peer.frames_after_barrier(s, self.next_stream()), [])

    def test_frames_for_unknown_streams_are_ignored(self):
        self.peer.send(REQUEST_BODY, 9999, None, b"late")
        self.peer.send(REQUEST_END, 9999)
        self.peer.send(CANCEL, 9998)
        self.assertEqual(self.peer.get(self.next_stream(), "/y").status, 200)

    def test_return_values_are_converted_as_ray_does(self):
        none = self.peer.get(self.next_stream(), "/none")
        self.assertEqual((none.body, none.headers["content-type"]), (b"null", "application/json"))
        raw = self.peer.get(self.next_stream(), "/bytes")
        self.assertEqual(raw.body, b"\x00\x01")
        self.assertEqual(raw.headers["content-type"], "application/octet-stream")
        s = self.next_stream()
        self.peer.request(s, "/unjsonable")
        frame = self.peer.next(stream=s)
        self.assertEqual((frame.type, frame.head["type"]), (ERROR, "TypeError"))

    def test_scope_and_replica_context(self):
        resp = self.peer.get(
            self.next_stream(), "/context", query="q=%C3%A9t%C3%A9", headers=[["x-test", "v\u00e9"]]
        )
        self.assertEqual(
            json.loads(resp.body),
            {
                "app": "default",
                "deployment": "Behaviors",
                "replica_id": "Behaviors#abc",
                "unique_id": "abc",
                "replica_tag": "Behaviors#abc",
                "same_instance": True,
                "root_path": "",
                "query": "\u00e9t\u00e9",
                "header": "v\u00e9",
            },
        )

    def test_load_on_a_deployment_without_a_loader_fails(self):
        reply = self.peer.control(self.next_stream(), {"op": "load", "model_id": "1"})
        self.assertEqual((reply["ok"], reply["error"]["type"]), (False, "TypeError"))

    def test_health_without_check_health_is_ok(self):
        self.assertEqual(self.peer.control(self.next_stream(), {"op": "health"}), {"ok": True})


class SyncCallTest(unittest.TestCase):
    def test_sync_call_runs_in_a_thread_with_the_model_id(self):
        peer = Peer("import:behaviors:sync_entry", "SyncEcho")
        try:
            peer.next(READY)
            results = []
            for s, model in [(1, "m1"), (2, "m2")]:
                peer.request(s, "/", model_id=model)
            for s in (1, 2):
                results.append(json.loads(peer.response(s).body))
            self.assertEqual(
                results, [{"model_id": "m1", "thread": False}, {"model_id": "m2", "thread": False}]
            )
            no_id = json.loads(peer.get(3, "/").body)
            self.assertEqual(no_id["model_id"], "")
        finally:
            self.assertEqual(peer.close(), 0)


class StartTest(unittest.TestCase):
    def test_init_exception_is_fatal(self):
        peer = Peer("import:behaviors:broken", "BrokenInit")
        try:
            fatal = peer.next(FATAL)
            self.assertEqual(fatal.head["type"], "RuntimeError")
            self.assertEqual(fatal.head["message"], "cannot start: no GPU")
            self.assertRegex(fatal.head["where"], r"behaviors\.py:\d+$")
            line = int(fatal.head["where"].rsplit(":", 1)[1])
            with open(os.path.join(APPS_DIR, "behaviors.py")) as f:
                self.assertIn("cannot start: no GPU", f.read().splitlines()[line - 1])
            self.assertIn("Traceback", fatal.head["traceback"])
            self.assertEqual(peer.proc.wait(10), 1)
            self.assertIn("cannot start: no GPU", peer.log())
        finally:
            peer.close()

    def test_unknown_deployment_is_fatal(self):
        peer = Peer("import:behaviors:entry", "NoSuch")
        try:
            fatal = peer.next(FATAL)
            self.assertEqual(fatal.head["type"], "ValueError")
            self.assertIn("NoSuch", fatal.head["message"])
            self.assertEqual(peer.proc.wait(10), 1)
        finally:
            peer.close()

    def test_user_config_reconfigure_and_health(self):
        peer = Peer("import:behaviors:configured", "Configured", user_config={"threshold": 3})
        try:
            peer.next(READY)
            self.assertEqual(json.loads(peer.get(1, "/").body), {"threshold": 3})
            reply = peer.control(2, {"op": "reconfigure", "user_config": {"threshold": 7}})
            self.assertEqual(reply, {"ok": True})
            self.assertEqual(json.loads(peer.get(3, "/").body), {"threshold": 7})
            bad = peer.control(4, {"op": "reconfigure", "user_config": {"threshold": -1}})
            self.assertEqual((bad["ok"], bad["error"]["type"]), (False, "ValueError"))
            self.assertEqual(bad["error"]["message"], "threshold must be positive")
            self.assertEqual(peer.control(5, {"op": "health"}), {"ok": True})
            sick_config = {"threshold": 1, "healthy": False}
            peer.control(6, {"op": "reconfigure", "user_config": sick_config})
            sick = peer.control(7, {"op": "health"})
            self.assertEqual(sick["ok"], False)
            self.assertEqual(sick["error"]["message"], "unhealthy on purpose")
        finally:
            self.assertEqual(peer.close(), 0)

    def test_a_bad_frame_closes_the_connection(self):
        peer = Peer("import:behaviors:entry", "Behaviors")
        try:
            peer.next(READY)
            peer.send(99, 1, None, b"")
            self.assertEqual(peer.proc.wait(10), 0)
            self.assertIn("unknown frame type 99", peer.log())
        finally:
            peer.close()

    def test_a_malformed_head_closes_the_connection(self):
        peer = Peer("import:behaviors:entry", "Behaviors")
        try:
            peer.next(READY)
            if peer.sock is None:
                raise AssertionError("the worker has not connected")
            # A CONTROL whose head is the JSON array [1], not an object.
            frame = b"\x00\x00\x00\x0c" + bytes([CONTROL]) + b"\x00\x00\x00\x01"
            peer.sock.sendall(frame + b"\x00\x00\x00\x03[1]")
            self.assertEqual(peer.proc.wait(10), 0)
            self.assertIn("head must be a JSON object", peer.log())
        finally:
            peer.close()

    def test_no_socket_means_exit_one(self):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "modelmux._worker",
                "--spec",
                json.dumps(
                    {
                        "socket": "/nonexistent/worker.sock",
                        "app_source": "import:behaviors:entry",
                        "working_dir": APPS_DIR,
                        "app_name": "default",
                        "deployment": "Behaviors",
                        "replica_id": "Behaviors#1",
                        "user_config": None,
                    }
                ),
            ],
            env=worker_env(),
            capture_output=True,
            timeout=30,
        )
        self.assertEqual(proc.returncode, 1)
        self.assertIn(b"cannot connect", proc.stderr)


if __name__ == "__main__":
    unittest.main()

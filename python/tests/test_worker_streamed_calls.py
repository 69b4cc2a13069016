"""Handle calls of any size, and stream=True: arguments over one frame go out in chunks
(CALL, CALL_BODY..., CALL_END), results come back in chunks (CALL_RESULT with `more`,
CALL_RESULT_BODY..., CALL_RESULT_END), and a generator's items are records
(`tag | u32 length | pickle`) read while the callee still yields. The record and frame
layouts are written here from docs/python-worker-protocol.md, not imported."""

import json
import pickle
import struct
import unittest

from tests.peer import (
    BODY,
    CALL,
    CALL_BODY,
    CALL_CANCEL,
    CALL_END,
    CALL_RESULT,
    CALL_RESULT_BODY,
    CALL_RESULT_END,
    END,
    ERROR,
    READY,
    START,
    Peer,
    WorkerTestCase,
)

MIB = 1024 * 1024


def record(tag: bytes, value) -> bytes:
    payload = pickle.dumps(value)
    return tag + struct.pack(">I", len(payload)) + payload


def parse_records(body: bytes) -> list:
    out, offset = [], 0
    while offset < len(body):
        tag = body[offset : offset + 1]
        (length,) = struct.unpack(">I", body[offset + 1 : offset + 5])
        out.append((tag, pickle.loads(body[offset + 5 : offset + 5 + length])))
        offset += 5 + length
    return out


class CallerTest(WorkerTestCase):
    APP = "import:composed:app"
    DEPLOYMENT = "Upstream"

    def test_arguments_over_a_frame_go_out_in_chunks(self):
        self.peer.request(1, "/big-args")
        call = self.peer.next(CALL)
        self.assertTrue(call.head["more"])
        self.assertEqual(call.head["method"], "size")
        self.assertLessEqual(len(call.data), MIB)
        data = bytearray(call.data)
        while True:
            frame = self.peer.next(stream=call.stream)
            if frame.type == CALL_END:
                break
            self.assertEqual(frame.type, CALL_BODY)
            self.assertLessEqual(len(frame.data), MIB)
            data += frame.data
        args, kwargs = pickle.loads(bytes(data))
        self.assertEqual((len(args[0]), kwargs), (3 * MIB + 5, {}))
        self.peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200}, pickle.dumps(len(args[0])))
        self.assertEqual(self.peer.response(1).body, str(3 * MIB + 5).encode())

    def test_a_result_in_chunks_is_put_together(self):
        self.peer.request(2, "/big-result")
        call = self.peer.next(CALL)
        blob = pickle.dumps(bytes(range(256)) * (5 * 4096))
        self.peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200, "more": True})
        for start in range(0, len(blob), 700_000):
            self.peer.send(CALL_RESULT_BODY, call.stream, None, blob[start : start + 700_000])
        self.peer.send(CALL_RESULT_END, call.stream, {})
        self.assertEqual(json.loads(self.peer.response(2).body), {"len": 5 * MIB, "ok": True})

    def test_a_result_cut_off_fails_the_call(self):
        self.peer.request(3, "/big-result")
        call = self.peer.next(CALL)
        self.peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200, "more": True})
        self.peer.send(CALL_RESULT_BODY, call.stream, None, b"\x80\x05")
        error = {"type": "DeploymentResponseError", "message": "the callee died", "status": 502}
        self.peer.send(CALL_RESULT_END, call.stream, {"error": error})
        frame = self.peer.next((START, ERROR), stream=3)
        self.assertEqual((frame.type, frame.head["type"]), (ERROR, "DeploymentUnavailableError"))
        self.assertIn("the callee died", frame.head["message"])

    def test_streamed_items_arrive_split_anywhere(self):
        self.peer.request(4, "/stream")
        call = self.peer.next(CALL)
        self.assertEqual((call.head["stream"], call.head["method"]), (True, "acount"))
        self.assertEqual(pickle.loads(call.data), ((4,), {}))
        body = b"".join(record(b"v", {"i": i}) for i in range(4))
        head = {"ok": True, "status": 200}
        # The first three bytes ride in the CALL_RESULT; the rest in pieces cutting records.
        self.peer.send(CALL_RESULT, call.stream, dict(head, more=True), body[:3])
        for start in range(3, len(body), 7):
            self.peer.send(CALL_RESULT_BODY, call.stream, None, body[start : start + 7])
        self.peer.send(CALL_RESULT_END, call.stream, {})
        self.assertEqual(json.loads(self.peer.response(4).body), [{"i": i} for i in range(4)])

    def test_an_exception_record_raises_in_the_caller_after_the_items_before_it(self):
        self.peer.request(5, "/stream-fail")
        call = self.peer.next(CALL)
        body = record(b"v", {"i": 0}) + record(b"v", {"i": 1}) + record(b"e", ValueError("failed at 2"))
        self.peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200, "more": True}, body)
        self.peer.send(CALL_RESULT_END, call.stream, {})
        self.assertEqual(
            json.loads(self.peer.response(5).body),
            {"got": [{"i": 0}, {"i": 1}], "error": "failed at 2"},
        )

    def test_a_caller_that_stops_early_cancels_the_call(self):
        self.peer.request(6, "/stream-first")
        call = self.peer.next(CALL)
        self.peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200, "more": True})
        self.peer.send(CALL_RESULT_BODY, call.stream, None, record(b"v", {"i": 0}))
        self.assertEqual(json.loads(self.peer.response(6).body), {"i": 0})
        self.assertEqual(self.peer.next(CALL_CANCEL, call.stream).type, CALL_CANCEL)


class SyncStreamTest(unittest.TestCase):
    def test_a_sync_method_iterates_a_stream_with_for(self):
        peer = Peer("import:composed:sync_app", "SyncCaller")
        try:
            peer.next(READY)
            peer.request(1, "/stream")
            call = peer.next(CALL)
            self.assertEqual((call.head["method"], call.head["stream"]), ("count", True))
            body = b"".join(record(b"v", i) for i in range(3))
            peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200, "more": True}, body)
            peer.send(CALL_RESULT_END, call.stream, {})
            self.assertEqual(json.loads(peer.response(1).body), [0, 1, 2])
        finally:
            self.assertEqual(peer.close(), 0)


class CalleeTest(WorkerTestCase):
    APP = "import:composed:app"
    DEPLOYMENT = "Downstream"

    def stream_call(self, stream: int, method: str, args=(), kwargs=None):
        body = pickle.dumps((args, kwargs or {}))
        self.peer.request(stream, "/", method="POST", body=body, call=method, streamed=True)
        start = self.peer.next(START, stream)
        self.assertEqual(dict(start.head["headers"])["x-modelmux-result"], "stream")
        frames = [start]
        while frames[-1].type != END:
            frames.append(self.peer.next(stream=stream))
        self.assertTrue(all(f.type == BODY for f in frames[1:-1]))
        return frames, parse_records(b"".join(f.data for f in frames))

    def test_a_sync_generator_streams_its_items_one_record_each(self):
        frames, items = self.stream_call(1, "count", (3,))
        self.assertEqual(items, [(b"v", 0), (b"v", 1), (b"v", 2)])
        # Each item went out as it was made: its own frame, not one body at the end.
        self.assertGreaterEqual(len([f for f in frames if f.data]), 3)

    def test_an_async_generator_that_raises_ends_with_an_exception_record(self):
        _, items = self.stream_call(2, "acount", (5,), {"fail_at": 2})
        self.assertEqual([tag for tag, _ in items], [b"v", b"v", b"e"])
        self.assertEqual(items[1][1], {"i": 1})
        self.assertIsInstance(items[2][1], ValueError)
        self.assertEqual(str(items[2][1]), "failed at 2")

    def test_stream_true_on_a_plain_method_is_a_type_error(self):
        _, items = self.stream_call(3, "not_a_generator", (1,))
        self.assertEqual(len(items), 1)
        self.assertIsInstance(items[0][1], TypeError)
        self.assertIn("not a generator", str(items[0][1]))

    def test_a_generator_called_without_stream_is_a_type_error_naming_stream_true(self):
        body = pickle.dumps(((3,), {}))
        self.peer.request(4, "/", method="POST", body=body, call="count")
        start = self.peer.next(START, 4)
        self.assertEqual(dict(start.head["headers"])["x-modelmux-result"], "exception")
        exc = pickle.loads(start.data)
        self.assertIsInstance(exc, TypeError)
        self.assertIn("stream=True", str(exc))


if __name__ == "__main__":
    unittest.main()

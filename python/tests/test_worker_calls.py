"""Handle calls: CALL frames from a deployment, and handle calls arriving as REQUESTs."""

import pickle
import unittest

from modelmux.serve.exceptions import RayServeException

from tests.peer import (
    CALL,
    CALL_RESULT,
    ERROR,
    READY,
    REQUEST_BODY,
    REQUEST_END,
    START,
    Peer,
    WorkerTestCase,
)


def answer(peer: Peer, value, *, exception: bool = False) -> None:
    """Answers the next CALL with a pickled value (or exception)."""
    call = peer.next(CALL)
    head = {"ok": True, "status": 500 if exception else 200, "exception": exception}
    peer.send(CALL_RESULT, call.stream, head, pickle.dumps(value))


class UpstreamTest(WorkerTestCase):
    APP = "import:composed:app"
    DEPLOYMENT = "Upstream"

    def test_options_model_id_goes_in_the_call(self):
        s = self.next_stream()
        self.peer.request(s, "/", model_id="foo")
        call = self.peer.next(CALL)
        self.assertEqual(
            call.head,
            {"deployment": "Downstream", "app": None, "method": "__call__", "model_id": "bar"},
        )
        self.assertEqual(pickle.loads(call.data), ((), {}))
        head = {"ok": True, "status": 200, "exception": False}
        self.peer.send(CALL_RESULT, call.stream, head, pickle.dumps("bar"))
        self.assertEqual(self.peer.response(s).body, b"bar")

    def test_model_id_is_not_inherited(self):
        s = self.next_stream()
        self.peer.request(s, "/plain", model_id="foo")
        call = self.peer.next(CALL)
        self.assertIsNone(call.head["model_id"])
        self.peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200}, pickle.dumps(""))
        self.assertEqual(self.peer.response(s).body, b"")

    def test_method_call_with_arguments(self):
        s = self.next_stream()
        self.peer.request(s, "/square")
        call = self.peer.next(CALL)
        self.assertEqual(call.head["method"], "square")
        self.assertEqual(pickle.loads(call.data), ((7,), {}))
        self.peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200}, pickle.dumps(49))
        self.assertEqual(self.peer.response(s).body, b"49")

    def test_a_response_passed_as_argument_is_awaited_first(self):
        s = self.next_stream()
        self.peer.request(s, "/chained")
        first = self.peer.next(CALL)
        self.assertEqual(pickle.loads(first.data), ((3,), {}))
        self.peer.send(CALL_RESULT, first.stream, {"ok": True, "status": 200}, pickle.dumps(9))
        second = self.peer.next(CALL)
        self.assertNotEqual(first.stream, second.stream)
        self.assertEqual(pickle.loads(second.data), ((9,), {}))
        self.peer.send(CALL_RESULT, second.stream, {"ok": True, "status": 200}, pickle.dumps(81))
        self.assertEqual(self.peer.response(s).body, b"81")

    def test_handles_inside_containers(self):
        s = self.next_stream()
        self.peer.request(s, "/other")
        call = self.peer.next(CALL)
        self.assertEqual(call.head["deployment"], "Helper")
        head = {"ok": True, "status": 200}
        self.peer.send(CALL_RESULT, call.stream, head, pickle.dumps("helped"))
        self.assertEqual(self.peer.response(s).body, b"helped")

    def test_callee_exception_is_raised_in_the_caller(self):
        s = self.next_stream()
        self.peer.request(s, "/square")
        answer(self.peer, LookupError("nope"), exception=True)
        frame = self.peer.next((START, ERROR), stream=s)
        self.assertEqual(
            (frame.type, frame.head["type"], frame.head["message"]), (ERROR, "LookupError", "nope")
        )

    def test_undeliverable_call_is_deployment_unavailable(self):
        s = self.next_stream()
        self.peer.request(s, "/square")
        call = self.peer.next(CALL)
        error = {"type": "overloaded", "message": "Downstream is overloaded", "status": 503}
        self.peer.send(CALL_RESULT, call.stream, {"ok": False, "error": error})
        frame = self.peer.next((START, ERROR), stream=s)
        self.assertEqual(frame.type, ERROR)
        self.assertEqual(frame.head["type"], "DeploymentUnavailableError")
        self.assertIn("Downstream is overloaded", frame.head["message"])
        self.assertIn("503", frame.head["message"])

    def test_result_on_the_event_loop_is_refused(self):
        s = self.next_stream()
        self.peer.request(s, "/blocking")
        frame = self.peer.next((START, ERROR), stream=s)
        self.assertEqual((frame.type, frame.head["type"]), (ERROR, "RuntimeError"))
        self.assertIn("await", frame.head["message"])
        # The call itself was started, as remote() does.
        answer(self.peer, "ignored")


class SyncCallerTest(unittest.TestCase):
    def test_result_from_a_sync_method(self):
        peer = Peer("import:composed:sync_app", "SyncCaller")
        try:
            peer.next(READY)
            peer.request(1, "/")
            call = peer.next(CALL)
            self.assertEqual(
                call.head,
                {"deployment": "Downstream", "app": None, "method": "square", "model_id": "sync"},
            )
            self.assertEqual(pickle.loads(call.data), ((5,), {}))
            peer.send(CALL_RESULT, call.stream, {"ok": True, "status": 200}, pickle.dumps(25))
            self.assertEqual(peer.response(1).body, b"25")
        finally:
            self.assertEqual(peer.close(), 0)


class DownstreamTest(WorkerTestCase):
    APP = "import:composed:app"
    DEPLOYMENT = "Downstream"

    def call(self, stream: int, method: str, args=(), kwargs=None, model_id=None):
        body = pickle.dumps((args, kwargs or {}))
        self.peer.request(stream, "/", method="POST", body=body, model_id=model_id, call=method)
        start = self.peer.next(START, stream)
        self.assertFalse(start.head["more"])
        headers = dict(start.head["headers"])
        return start.head["status"], headers["x-modelmux-result"], pickle.loads(start.data)

    def test_call_without_request_argument_gets_the_model_id(self):
        self.assertEqual(self.call(1, "__call__", model_id="bar"), (200, "value", "bar"))

    def test_method_with_arguments(self):
        self.assertEqual(self.call(2, "square", (4,)), (200, "value", 16))

    def test_exception_comes_back_pickled(self):
        status, kind, exc = self.call(3, "fail")
        self.assertEqual((status, kind), (500, "exception"))
        self.assertIsInstance(exc, LookupError)
        self.assertEqual(str(exc), "downstream failed")

    def test_unknown_method_is_an_attribute_error_and_names_the_methods(self):
        status, kind, exc = self.call(4, "nope")
        self.assertEqual((status, kind), (500, "exception"))
        self.assertIsInstance(exc, AttributeError)
        self.assertIsInstance(exc, RayServeException)
        self.assertIn("'nope'", str(exc))
        self.assertIn("Available methods: ['__call__', 'acount',", str(exc))

    def test_call_body_in_chunks(self):
        body = pickle.dumps(((12,), {}))
        self.peer.request(5, "/", method="POST", body=body[:3], call="square", more=True)
        self.peer.send(REQUEST_BODY, 5, None, body[3:])
        self.peer.send(REQUEST_END, 5)
        start = self.peer.next(START, 5)
        self.assertEqual(pickle.loads(start.data), 144)


if __name__ == "__main__":
    unittest.main()

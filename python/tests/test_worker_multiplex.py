"""The worker with Ray's ModelInferencer: loads, unloads, ACQUIRE, loader errors."""

import json
import os
import pickle
import time
import unittest

import numpy as np

from tests.peer import ACQUIRE, CALL_RESULT, ERROR, START, WorkerTestCase


class MultiplexedWorkerTest(WorkerTestCase):
    APP = "import:inferencer:entry"
    DEPLOYMENT = "ModelInferencer"

    def predict(self, model_id: str, x: list[float]):
        s = self.next_stream()
        return self.peer.get(
            s, "/", method="POST", body=json.dumps({"x": x}).encode(), model_id=model_id
        )

    def test_ready_names_the_pid_and_multiplexing(self):
        self.assertEqual(self.ready.head, {"pid": self.peer.proc.pid, "multiplexed": True})
        self.assertEqual(self.ready.stream, 0)

    def test_numpy_model_answers_after_a_load(self):
        reply = self.peer.control(self.next_stream(), {"op": "load", "model_id": "2"})
        self.assertEqual(reply, {"ok": True, "size_bytes": 64})
        resp = self.predict("2", [1, 2, 3, 4])
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.headers["content-type"], "application/json")
        expected = np.array([1, 2, 3, 4.0]) @ (np.arange(8.0).reshape(4, 2) * 2)
        self.assertEqual(json.loads(resp.body), {"model_id": "2", "y": expected.tolist()})
        self.assertEqual(len(resp.frames), 1)  # one START with more=false

    def test_unload_runs_del_exactly_once(self):
        self.peer.control(self.next_stream(), {"op": "load", "model_id": "5"})
        self.assertEqual(self.predict("5", [1, 0, 0, 0]).status, 200)
        self.assertNotIn("5\n", self.peer.out_file("deleted"))
        reply = self.peer.control(self.next_stream(), {"op": "unload", "model_id": "5"})
        self.assertEqual(reply, {"ok": True})
        self.assertEqual(self.peer.out_file("deleted").splitlines().count("5"), 1)
        time.sleep(0.2)
        self.assertEqual(self.peer.out_file("deleted").splitlines().count("5"), 1)
        # Gone from the table: a request for it now asks the server for it.
        s = self.next_stream()
        self.peer.request(s, "/", method="POST", body=b'{"x": [1, 1, 1, 1]}', model_id="5")
        acquire = self.peer.next(ACQUIRE)
        self.assertEqual(acquire.head, {"model_id": "5", "request": s})
        self.peer.control(self.next_stream(), {"op": "load", "model_id": "5"})
        self.peer.send(CALL_RESULT, acquire.stream, {"ok": True, "status": 200})
        self.assertEqual(json.loads(self.peer.response(s).body)["y"], [60.0, 80.0])

    def test_unload_of_an_unknown_model_is_ok(self):
        reply = self.peer.control(self.next_stream(), {"op": "unload", "model_id": "nope"})
        self.assertEqual(reply, {"ok": True})

    def test_loader_exception_replies_not_ok(self):
        reply = self.peer.control(self.next_stream(), {"op": "load", "model_id": "666"})
        self.assertFalse(reply["ok"])
        self.assertEqual(reply["error"]["type"], "ValueError")
        self.assertEqual(reply["error"]["message"], "model 666 is cursed")
        self.assertIn("inferencer.py", reply["error"]["traceback"])
        self.assertIn("model 666 is cursed", self.peer.log())
        self.assertEqual(self.peer.control(self.next_stream(), {"op": "health"}), {"ok": True})

    def test_ensemble_acquires_another_model_for_its_request(self):
        self.peer.control(self.next_stream(), {"op": "load", "model_id": "7"})
        s = self.next_stream()
        self.peer.request(s, "/ensemble", model_id="7", query="ids=8,7")
        acquire = self.peer.next(ACQUIRE)
        self.assertEqual(acquire.head, {"model_id": "8", "request": s})
        self.assertEqual(self.peer.frames_for(s, 0.1), [])  # waiting for the model
        self.assertEqual(
            self.peer.control(self.next_stream(), {"op": "load", "model_id": "8"})["ok"], True
        )
        self.peer.send(CALL_RESULT, acquire.stream, {"ok": True, "status": 200})
        body = json.loads(self.peer.response(s).body)
        self.assertEqual(body, {"model_id": "7", "ensemble": ["7", "8", "7"]})

    def test_a_model_in_the_table_but_not_held_for_the_request_is_acquired_first(self):
        # Model 8 is loaded (for another request), but this request holds only 7: the server
        # must hold 8 for it too before it is used, or 8 could be unloaded mid-request.
        self.peer.control(self.next_stream(), {"op": "load", "model_id": "7"})
        self.peer.control(self.next_stream(), {"op": "load", "model_id": "8"})
        s = self.next_stream()
        self.peer.request(s, "/ensemble", model_id="7", query="ids=8,8,7")
        acquire = self.peer.next(ACQUIRE)
        self.assertEqual(acquire.head, {"model_id": "8", "request": s})
        self.peer.send(CALL_RESULT, acquire.stream, {"ok": True, "status": 200})
        body = json.loads(self.peer.response(s).body)
        # One ACQUIRE: the second use of 8 is already held.
        self.assertEqual(body, {"model_id": "7", "ensemble": ["7", "8", "8", "7"]})
        self.assertEqual(self.peer.frames_for(s, 0.1), [])

    def test_failed_acquire_fails_the_request(self):
        self.peer.control(self.next_stream(), {"op": "load", "model_id": "9"})
        s = self.next_stream()
        self.peer.request(s, "/ensemble", model_id="9", query="ids=666")
        acquire = self.peer.next(ACQUIRE)
        error = {"type": "ValueError", "message": "model 666 is cursed", "status": 500}
        self.peer.send(CALL_RESULT, acquire.stream, {"ok": False, "error": error})
        frame = self.peer.next(stream=s)
        self.assertEqual(frame.type, ERROR)
        self.assertEqual(frame.head["type"], "ModelLoadError")
        self.assertIn("model 666 is cursed", frame.head["message"])

    def test_get_model_outside_a_request_is_an_error(self):
        open(os.path.join(self.peer.out_dir, "probe-unloaded"), "w").close()
        try:
            reply = self.peer.control(self.next_stream(), {"op": "health"})
        finally:
            os.remove(os.path.join(self.peer.out_dir, "probe-unloaded"))
        self.assertFalse(reply["ok"])
        self.assertEqual(reply["error"]["type"], "RuntimeError")
        self.assertIn("no request is in progress", reply["error"]["message"])

    def test_loaded_model_id_is_validated(self):
        reply = self.peer.control(self.next_stream(), {"op": "load", "model_id": ""})
        self.assertFalse(reply["ok"])
        self.assertEqual(reply["error"]["type"], "ValueError")

    def test_unknown_control_op_is_an_error(self):
        reply = self.peer.control(self.next_stream(), {"op": "dance"})
        self.assertFalse(reply["ok"])
        self.assertIn("dance", reply["error"]["message"])

    def test_incoming_handle_call_uses_the_loaded_model(self):
        self.peer.control(self.next_stream(), {"op": "load", "model_id": "3"})
        s = self.next_stream()
        payload = pickle.dumps((("3",), {}))
        self.peer.request(s, "/", method="POST", body=payload, model_id="3", call="weight_sum")
        start = self.peer.next(START, s)
        self.assertEqual(start.head["status"], 200)
        self.assertIn(["x-modelmux-result", "value"], start.head["headers"])
        self.assertEqual(pickle.loads(start.data), 28.0 * 3)

if __name__ == "__main__":
    unittest.main()

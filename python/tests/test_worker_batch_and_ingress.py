"""`@serve.batch` per model id, and a FastAPI ingress with class-based routes, in a worker."""

import json
import unittest

from tests.peer import READY, Peer, WorkerTestCase


class BatchTest(unittest.TestCase):
    def test_batches_hold_one_model_id_each(self):
        peer = Peer("import:batched:entry", "Batched")
        try:
            peer.next(READY)
            models = ["a", "b", "c"]
            for n, model in enumerate(models, start=1000):
                self.assertEqual(peer.control(n, {"op": "load", "model_id": model})["ok"], True)
            sent = {}
            for i in range(24):
                model = models[i % 3]
                sent[i + 1] = (model, i)
                peer.request(i + 1, "/", model_id=model, query=f"i={i}")
            sizes = []
            for stream, (model, i) in sent.items():
                body = json.loads(peer.response(stream).body)
                self.assertEqual((body["batch_model"], body["item"]), (model, i))
                sizes.append(body["size"])
            self.assertGreater(max(sizes), 1)
            self.assertLessEqual(max(sizes), 8)
            batches = [json.loads(line) for line in peer.out_file("batches").splitlines()]
            self.assertEqual(sum(len(b["items"]) for b in batches), 24)
            for b in batches:
                self.assertEqual({models[i % 3] for i in b["items"]}, {b["model"]})
        finally:
            self.assertEqual(peer.close(), 0)


class FastApiIngressTest(WorkerTestCase):
    APP = "import:fastapi_app:entry"
    DEPLOYMENT = "Api"

    def test_class_route_gets_the_instance(self):
        resp = self.peer.get(1, "/hello", query="name=bob", model_id="m1")
        self.assertEqual(resp.status, 200)
        self.assertEqual(json.loads(resp.body), {"message": "hi bob", "model_id": "m1"})

    def test_post_with_path_parameter_and_json_body(self):
        resp = self.peer.get(
            2,
            "/items/3",
            method="POST",
            body=b'{"k": [1, 2]}',
            headers=[["content-type", "application/json"]],
        )
        self.assertEqual(
            json.loads(resp.body), {"item_id": 3, "payload": {"k": [1, 2]}, "prefix": "hi"}
        )

    def test_module_level_route(self):
        self.assertEqual(json.loads(self.peer.get(3, "/module-level").body), {"where": "module"})

    def test_root_path_is_the_route_prefix(self):
        resp = self.peer.get(4, "/api/hello", root_path="/api")
        self.assertEqual(json.loads(resp.body)["message"], "hi world")

    def test_unknown_path_is_fastapis_404(self):
        self.assertEqual(self.peer.get(5, "/nowhere").status, 404)

    def test_lifespan_state_reaches_requests(self):
        self.assertEqual(json.loads(self.peer.get(7, "/state").body), {"started": True})

    def test_self_is_not_a_query_parameter(self):
        resp = self.peer.get(6, "/openapi.json")
        params = json.loads(resp.body)["paths"]["/hello"]["get"].get("parameters", [])
        self.assertEqual([p["name"] for p in params], ["name"])


if __name__ == "__main__":
    unittest.main()

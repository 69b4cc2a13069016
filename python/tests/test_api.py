"""In-process checks of `modelmux.serve`'s decorators, handles and context."""

import asyncio
import pickle
import unittest

from modelmux import serve
from modelmux._api.multiplex import find_multiplexed
from modelmux._api.graph import deployments_of
from modelmux.serve.exceptions import BatchSizeMismatchError, RayServeException
from modelmux.serve.handle import DeploymentHandle


class DeploymentOptionsTest(unittest.TestCase):
    def test_bare_decorator_records_no_options(self):
        @serve.deployment
        class Model:
            pass

        self.assertIsInstance(Model, serve.Deployment)
        self.assertEqual(Model.name, "Model")
        self.assertEqual(Model.user_options, {})

    def test_options_are_recorded_only_when_set(self):
        @serve.deployment(num_replicas=2, max_ongoing_requests=8, version="v2")
        class Model:
            pass

        self.assertEqual(
            Model.user_options, {"num_replicas": 2, "max_ongoing_requests": 8, "version": "v2"}
        )
        self.assertEqual(Model.version, "v2")
        renamed = Model.options(name="Other", user_config={"a": [1]})
        self.assertEqual(renamed.name, "Other")
        self.assertEqual(renamed.user_options["num_replicas"], 2)
        self.assertEqual(Model.name, "Model")  # options() copies

    def test_every_supported_option_is_accepted(self):
        serve.deployment(
            name="n",
            num_replicas=1,
            max_ongoing_requests=1,
            max_queued_requests=-1,
            user_config=None,
            health_check_period_s=1.5,
            health_check_timeout_s=2,
            graceful_shutdown_timeout_s=0,
            version="1",
        )

    def test_ray_only_options_are_refused_by_name(self):
        for name, value in [
            ("ray_actor_options", {"num_gpus": 1}),
            ("placement_group_bundles", [{"CPU": 1}]),
            ("placement_group_strategy", "PACK"),
            ("max_replicas_per_node", 1),
            ("logging_config", {}),
            ("request_router_config", {}),
            ("graceful_shutdown_wait_loop_s", 1),
            ("route_prefix", "/x"),
        ]:
            with self.subTest(name=name):
                with self.assertRaises(TypeError) as ctx:
                    serve.deployment(**{name: value})
                self.assertEqual(
                    str(ctx.exception), f"modelmux does not support the deployment option '{name}'"
                )

    def test_unknown_option_is_refused_by_name(self):
        with self.assertRaisesRegex(TypeError, "'colour' is not a deployment option"):
            serve.deployment(colour="blue")

        @serve.deployment
        class Model:
            pass

        with self.assertRaisesRegex(TypeError, "ray_actor_options"):
            Model.options(ray_actor_options={})

    def test_autoscaling_options_are_rays(self):
        @serve.deployment(num_replicas="auto")
        class Auto:
            pass

        self.assertEqual(Auto.user_options["num_replicas"], "auto")

        @serve.deployment(autoscaling_config={"min_replicas": 0, "max_replicas": 4})
        class Scaled:
            pass

        # A fixed count replaces inherited autoscaling, and autoscaling a fixed count.
        fixed = Scaled.options(num_replicas=2).user_options
        self.assertEqual((fixed["num_replicas"], "autoscaling_config" in fixed), (2, False))
        again = Scaled.options(num_replicas=2).options(autoscaling_config={"max_replicas": 3})
        self.assertNotIn("num_replicas", again.user_options)
        # Ray's rule: both at once is an error; unknown keys and bad values are refused.
        with self.assertRaisesRegex(ValueError, "num_replicas"):
            serve.deployment(num_replicas=2, autoscaling_config={"max_replicas": 4})
        with self.assertRaisesRegex(TypeError, "policy"):
            serve.deployment(autoscaling_config={"policy": "my:policy"})
        with self.assertRaisesRegex(TypeError, "max_replicas"):
            serve.deployment(autoscaling_config={"max_replicas": "many"})
        with self.assertRaisesRegex(ValueError, "aggregation_function"):
            serve.deployment(autoscaling_config={"aggregation_function": "median"})

    def test_auto_replicas_and_bad_values(self):
        with self.assertRaises(ValueError):
            serve.deployment(num_replicas=0)
        with self.assertRaises(TypeError):
            serve.deployment(num_replicas=True)
        with self.assertRaises(ValueError):
            serve.deployment(max_queued_requests=0)
        with self.assertRaises(ValueError):
            serve.deployment(health_check_period_s=0)
        with self.assertRaises(TypeError):
            serve.deployment(user_config={"f": object()})

    def test_functions_and_direct_construction_are_refused(self):
        with self.assertRaisesRegex(TypeError, "function deployments"):
            serve.deployment(lambda request: "hi")

        @serve.deployment
        class Model:
            pass

        with self.assertRaisesRegex(TypeError, r"Model\.bind"):
            Model()


class GraphTest(unittest.TestCase):
    def test_bound_deployments_in_containers_are_found(self):
        @serve.deployment
        class Leaf:
            pass

        @serve.deployment
        class Root:
            def __init__(self, *args, **kwargs):
                pass

        a, b, c = Leaf.bind(), Leaf.options(name="B").bind(), Leaf.options(name="C").bind()
        root = Root.bind([a, (b,)], named={"c": c, "again": a})
        self.assertEqual(list(deployments_of(root)), ["Root", "Leaf", "B", "C"])

    def test_two_multiplexed_methods_are_refused_at_bind(self):
        @serve.deployment
        class Two:
            @serve.multiplexed
            async def one(self, model_id: str):
                return model_id

            @serve.multiplexed(max_num_models_per_replica=2)
            async def two(self, model_id: str):
                return model_id

        with self.assertRaisesRegex(TypeError, "more than one @serve.multiplexed method"):
            Two.bind()


class MultiplexedTest(unittest.TestCase):
    def test_unknown_arguments_are_named(self):
        with self.assertRaisesRegex(TypeError, "'max_models'"):
            serve.multiplexed(max_models=3)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            serve.multiplexed(max_num_models_per_replica=0)
        with self.assertRaises(ValueError):
            serve.multiplexed(max_bytes_per_replica=-5)
        with self.assertRaises(TypeError):
            serve.multiplexed(size_bytes=12)
        with self.assertRaisesRegex(TypeError, r"must take \(self, model_id\)"):
            serve.multiplexed(lambda: None)
        with self.assertRaisesRegex(TypeError, r"must take \(self, model_id\)"):
            serve.multiplexed(lambda self, a, b: None)
        with self.assertRaisesRegex(TypeError, "decorates a method"):
            serve.multiplexed(type("Model", (), {}))

    def test_plain_loaders_need_allow_sync_as_ray_refuses_them(self):
        def get_model(model_id: str):
            return model_id

        with self.assertRaisesRegex(TypeError, "must be `async def`.*allow_sync=True"):
            serve.multiplexed(get_model)
        self.assertEqual(serve.multiplexed(allow_sync=True)(get_model)("a"), "a")

    def test_a_plain_function_loader_is_found_through_the_methods_that_call_it(self):
        @serve.multiplexed(max_num_models_per_replica=2)
        async def get_model(model_id: str):
            return f"model-{model_id}"

        class Inferencer:
            async def __call__(self, request):
                return await get_model(serve.get_multiplexed_model_id())

        found = find_multiplexed(Inferencer)
        self.assertIsNotNone(found)
        self.assertEqual(found[0], "get_model")
        self.assertFalse(found[1].method)
        self.assertEqual(found[1].max_num_models_per_replica, 2)
        # Outside a replica it just loads.
        self.assertEqual(asyncio.run(get_model("1")), "model-1")

    def test_outside_a_worker_the_loader_runs_directly_and_uncached(self):
        loads = []

        class Inferencer:
            @serve.multiplexed(max_num_models_per_replica=3)
            async def get_model(self, model_id: str):
                loads.append(model_id)
                return f"model-{model_id}"

            @serve.multiplexed(allow_sync=True)
            def get_sync(self, model_id: str):
                loads.append(model_id)
                return model_id.upper()

        inferencer = Inferencer()
        self.assertEqual(asyncio.run(inferencer.get_model("1")), "model-1")
        self.assertEqual(asyncio.run(inferencer.get_model("1")), "model-1")
        self.assertEqual(inferencer.get_sync("a"), "A")
        self.assertEqual(loads, ["1", "1", "a"])
        with self.assertRaisesRegex(TypeError, "must be a string"):
            asyncio.run(inferencer.get_model(1))
        with self.assertRaisesRegex(ValueError, "cannot be empty"):
            inferencer.get_sync("")


class ContextTest(unittest.TestCase):
    def test_no_model_id_outside_a_request(self):
        self.assertEqual(serve.get_multiplexed_model_id(), "")

    def test_no_replica_context_outside_a_replica(self):
        with self.assertRaises(RayServeException):
            serve.get_replica_context()


class HandleTest(unittest.TestCase):
    def test_options_and_methods(self):
        handle = DeploymentHandle("Down", "app")
        h = handle.options(multiplexed_model_id="m").predict
        self.assertEqual(
            repr(h),
            "DeploymentHandle(deployment='Down', app='app', method='predict', "
            "multiplexed_model_id='m')",
        )
        self.assertEqual(h.deployment_name, "Down")
        again = pickle.loads(pickle.dumps(h))
        self.assertEqual(repr(again), repr(h))
        self.assertEqual(repr(h.options(multiplexed_model_id="")), repr(handle.predict))

    def test_unsupported_options(self):
        handle = DeploymentHandle("Down")
        with self.assertRaisesRegex(TypeError, "'use_new_handle_api'"):
            handle.options(use_new_handle_api=True)
        with self.assertRaisesRegex(TypeError, "stream must be a bool"):
            handle.options(stream="yes")
        # Streams are read inside deployments; a driver is told so at once.
        with self.assertRaisesRegex(TypeError, "stream=True handle calls are made inside"):
            handle.options(stream=True).remote()
        with self.assertRaises(AttributeError):
            handle._private

    def test_remote_without_a_server_fails_on_result(self):
        with self.assertRaisesRegex(RuntimeError, "serve.run"):
            DeploymentHandle("Down").remote().result(timeout_s=5)


class BatchTest(unittest.TestCase):
    def test_argument_checks(self):
        with self.assertRaisesRegex(TypeError, "'max_size'"):
            serve.batch(max_size=3)
        with self.assertRaises(ValueError):
            serve.batch(max_batch_size=0)
        with self.assertRaises(ValueError):
            serve.batch(batch_wait_timeout_s=-1)
        with self.assertRaises(ValueError):
            serve.batch(max_concurrent_batches=0)
        with self.assertRaisesRegex(TypeError, "async def"):
            serve.batch(lambda items: items)

    def test_batches_split_by_model_id(self):
        seen = []

        class Model:
            @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
            async def double(self, items: list) -> list:
                seen.append((serve.get_multiplexed_model_id(), list(items)))
                return [i * 2 for i in items]

        async def one(model: Model, model_id: str, i: int) -> tuple:
            from modelmux._api.context import set_model_id

            set_model_id(model_id)
            return model_id, await model.double(i)

        async def main() -> list:
            model = Model()
            calls = [one(model, "abc"[i % 3], i) for i in range(12)]
            return await asyncio.gather(*calls)

        results = asyncio.run(main())
        self.assertEqual(results, [("abc"[i % 3], i * 2) for i in range(12)])
        self.assertEqual(sum(len(items) for _, items in seen), 12)
        self.assertGreater(max(len(items) for _, items in seen), 1)
        for model_id, items in seen:
            self.assertEqual({"abc"[i % 3] for i in items}, {model_id})
            self.assertLessEqual(len(items), 4)

    def test_bare_decorator_on_a_function(self):
        @serve.batch
        async def total(items: list) -> list:
            return [sum(items)] * len(items)

        async def main() -> list:
            return await asyncio.gather(total(1), total(2), total(3))

        self.assertEqual(asyncio.run(main()), [6, 6, 6])

    def test_wrong_result_length_fails_every_caller(self):
        @serve.batch(max_batch_size=3, batch_wait_timeout_s=0.05)
        async def short(items: list) -> list:
            return items[:-1]

        async def main() -> list:
            return await asyncio.gather(short(1), short(2), short(3), return_exceptions=True)

        errors = asyncio.run(main())
        self.assertEqual(len(errors), 3)
        for error in errors:
            self.assertIsInstance(error, BatchSizeMismatchError)
            self.assertIn("returned 2 results for a batch of 3", str(error))


class IngressTest(unittest.TestCase):
    def test_requires_an_asgi_app(self):
        with self.assertRaises(TypeError):
            serve.ingress("not an app")


if __name__ == "__main__":
    unittest.main()

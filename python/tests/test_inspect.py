"""`python -m modelmux._worker --inspect`."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import cloudpickle

from tests.peer import APPS_DIR, worker_env


def inspect(app_source: str, working_dir: str | None = APPS_DIR) -> tuple[int, dict, str]:
    spec = json.dumps({"app_source": app_source, "working_dir": working_dir})
    proc = subprocess.run(
        [sys.executable, "-m", "modelmux._worker", "--inspect", "--spec", spec],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.splitlines()
    if len(lines) != 1:
        raise AssertionError(f"inspect printed {len(lines)} lines, not one: {proc.stdout!r}")
    return proc.returncode, json.loads(lines[0]), proc.stderr


MUX3 = {"max_num_models_per_replica": 3, "max_bytes_per_replica": None}


def app_line(file: str, text: str) -> int:
    with open(os.path.join(APPS_DIR, file)) as f:
        return next(n for n, line in enumerate(f, 1) if text in line)


class InspectTest(unittest.TestCase):
    def test_graph(self):
        code, out, _ = inspect("import:graph:app")
        self.assertEqual(code, 0)
        self.assertEqual(
            out,
            {
                "ok": True,
                "ingress": "Upstream",
                "deployments": [
                    {
                        "name": "Upstream",
                        "options": {"max_ongoing_requests": 5, "user_config": {"a": 1}},
                        "multiplexed": None,
                        "handles": ["Downstream", "Second"],
                        "has_reconfigure": True,
                    },
                    {
                        "name": "Downstream",
                        "options": {"num_replicas": 2},
                        "multiplexed": MUX3,
                        "handles": [],
                        "has_reconfigure": False,
                    },
                    {
                        "name": "Second",
                        "options": {"num_replicas": 2},
                        "multiplexed": MUX3,
                        "handles": [],
                        "has_reconfigure": False,
                    },
                ],
            },
        )

    def test_module_failing_to_import(self):
        code, out, stderr = inspect("import:bad_import:app")
        self.assertEqual(code, 2)
        line = app_line("bad_import.py", "1 / 0")
        path = os.path.join(APPS_DIR, "bad_import.py")
        error = f"{path}:{line}: ZeroDivisionError: division by zero"
        self.assertEqual(out, {"ok": False, "error": error})
        self.assertIn("Traceback", stderr)

    def test_plain_class(self):
        code, out, _ = inspect("import:plain_class:NotADeployment")
        self.assertEqual(code, 2)
        line = app_line("plain_class.py", "class NotADeployment")
        where = f"{os.path.join(APPS_DIR, 'plain_class.py')}:{line}"
        self.assertTrue(out["error"].startswith(f"{where}: TypeError: "))
        self.assertIn(
            "'plain_class:NotADeployment' is the class NotADeployment, not a deployment",
            out["error"],
        )

    def test_unbound_deployment(self):
        code, out, _ = inspect("import:graph:Upstream")
        self.assertEqual(code, 2)
        self.assertIn("is the deployment Upstream, not an application", out["error"])

    def test_unknown_option(self):
        code, out, _ = inspect("import:bad_option:app")
        self.assertEqual(code, 2)
        line = app_line("bad_option.py", "ray_actor_options")
        self.assertEqual(
            out["error"],
            f"{os.path.join(APPS_DIR, 'bad_option.py')}:{line}: TypeError: "
            "modelmux does not support the deployment option 'ray_actor_options'",
        )

    def test_syntax_error(self):
        code, out, _ = inspect("import:syntax_error:app")
        self.assertEqual(code, 2)
        where = os.path.join(APPS_DIR, "syntax_error.py")
        self.assertEqual(out["error"], f"{where}:3: SyntaxError: invalid syntax")

    def test_a_deployment_bound_twice_gets_a_second_name_as_in_ray(self):
        code, out, _ = inspect("import:dup_names:app")
        self.assertEqual(code, 0, out)
        self.assertEqual([d["name"] for d in out["deployments"]], ["Root", "Leaf", "Leaf_1"])

    def test_missing_attribute(self):
        code, out, _ = inspect("import:graph:nothing")
        self.assertEqual(code, 2)
        self.assertIn("AttributeError: module 'graph' has no attribute 'nothing'", out["error"])

    def test_prints_during_import_stay_off_stdout(self):
        code, out, stderr = inspect("import:noisy:app")
        self.assertEqual((code, out["ingress"]), (0, "Quiet"))
        self.assertIn("hello from an import", stderr)
        self.assertIn("and from a subprocess", stderr)

    def test_pickle_source(self):
        sys.path.insert(0, APPS_DIR)
        try:
            import composed
        finally:
            sys.path.remove(APPS_DIR)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "app.pkl")
            with open(path, "wb") as f:
                f.write(cloudpickle.dumps(composed.sync_app))
            code, out, _ = inspect(f"pickle:{path}")
        self.assertEqual(code, 0)
        self.assertEqual([d["name"] for d in out["deployments"]], ["SyncCaller", "Downstream"])

    def test_bad_source_kind(self):
        code, out, _ = inspect("http://example.com/app")
        self.assertEqual(code, 2)
        self.assertIn("must be import:module:attr or pickle:/path", out["error"])


if __name__ == "__main__":
    unittest.main()

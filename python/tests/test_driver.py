"""The driver side: `serve.run` and friends against a stand-in server binary, handles over
HTTP, the binary look-up, `python -m modelmux` and the package's version."""

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import unittest

from modelmux import serve
from modelmux._binary import BinaryNotFoundError, find_binary
from modelmux.serve.exceptions import DeploymentUnavailableError
from tests.peer import PYTHON_DIR, worker_env

FAKE_SERVER = os.path.join(PYTHON_DIR, "tests", "fake_server.py")


@serve.deployment
class App:
    def echo(self, *args, **kwargs):
        return args, kwargs


@serve.deployment
class Other:
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def executable(path: str, text: str) -> str:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


class DriverTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.record = os.path.join(self.dir.name, "record.jsonl")
        binary = executable(
            os.path.join(self.dir.name, "modelmux"),
            f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SERVER}" "$@"\n',
        )
        names = ("MODELMUX_BIN", "MODELMUX_FAKE_RECORD", "MODELMUX_FAKE_MODE")
        self.saved = {k: os.environ.get(k) for k in names}
        os.environ.update(MODELMUX_BIN=binary, MODELMUX_FAKE_RECORD=self.record)
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})

    def tearDown(self):
        serve.shutdown()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.dir.cleanup()

    def records(self) -> list[dict]:
        with open(self.record) as f:
            return [json.loads(line) for line in f]

    def test_run_calls_status_restart_and_shutdown(self):
        handle = serve.run(App.bind(), name="first", route_prefix="/first")
        [record] = self.records()
        config = record["config"]
        self.assertEqual(record["argv"][0], "serve")
        self.assertEqual(len(config["http_options"]["admin_token"]) > 20, True)
        self.assertEqual(config["http_options"]["host"], "127.0.0.1")
        [app] = config["applications"]
        self.assertEqual((app["name"], app["route_prefix"]), ("first", "/first"))
        self.assertTrue(app["import_path"].startswith("pickle:"))
        self.assertEqual(record["ingress"], {"first": "App"})
        self.assertEqual(record["env"]["MODELMUX_PYTHON"], sys.executable)
        self.assertIn(os.getcwd(), record["env"]["PYTHONPATH"].split(os.pathsep))

        value = handle.echo.remote(1, b=2).result(timeout_s=10)
        self.assertEqual(
            value,
            {
                "deployment": "App",
                "app": "first",
                "args": (1,),
                "kwargs": {"b": 2},
                "model_id": None,
            },
        )
        with_id = handle.options(multiplexed_model_id="m7").echo.remote().result()
        self.assertEqual(with_id["model_id"], "m7")

        async def awaited():
            return await handle.echo.remote(3)

        self.assertEqual(asyncio.run(awaited())["args"], (3,))
        chained = handle.echo.remote(handle.echo.remote(5)).result()
        self.assertEqual(chained["args"][0]["args"], (5,))
        with self.assertRaisesRegex(ValueError, "boom from fake"):
            handle.boom.remote().result()
        with self.assertRaises(DeploymentUnavailableError) as ctx:
            handle.nope.remote().result()
        self.assertEqual((ctx.exception.status, ctx.exception.message), (404, "no method nope"))

        status = serve.status()
        self.assertEqual(status.applications["first"].status, "RUNNING")
        self.assertEqual(status.applications["first"].route_prefix, "/first")
        self.assertEqual(status.applications["first"].deployments["App"].status, "HEALTHY")
        self.assertEqual(serve.get_app_handle("first").echo.remote().result()["deployment"], "App")
        self.assertEqual(serve.get_deployment_handle("App").deployment_name, "App")
        with self.assertRaises(ValueError):
            serve.get_deployment_handle("Nope")

        serve.run(Other.bind(), name="second", route_prefix="/second")
        first, second = self.records()
        self.assertNotEqual(first["pid"], second["pid"])
        self.assertEqual(second["ingress"], {"first": "App", "second": "Other"})
        self.assertFalse(os.path.exists(first["argv"][1]))  # the old temp dir is gone
        with self.assertRaisesRegex(ValueError, "already serves"):
            serve.run(Other.bind(), name="third", route_prefix="/second")

        serve.delete("second")
        self.assertEqual(self.records()[-1]["ingress"], {"first": "App"})

        last = self.records()[-1]
        serve.shutdown()
        self.assertFalse(os.path.exists(last["argv"][1]))
        with self.assertRaises(ProcessLookupError):
            os.kill(last["pid"], 0)
        self.assertEqual(serve.status().applications, {})
        with self.assertRaisesRegex(RuntimeError, "serve.run"):
            handle.echo.remote().result()

    def test_server_that_exits_is_reported(self):
        os.environ["MODELMUX_FAKE_MODE"] = "exit3"
        started = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "exited with status 3"):
            serve.run(App.bind())
        self.assertLess(time.monotonic() - started, 30)

    def test_run_refuses_what_is_not_an_application(self):
        with self.assertRaisesRegex(TypeError, r"App\.bind\(\)"):
            serve.run(App)
        with self.assertRaisesRegex(ValueError, "route_prefix"):
            serve.run(App.bind(), route_prefix="nope")


class BinaryTest(unittest.TestCase):
    def setUp(self):
        self.saved = os.environ.get("MODELMUX_BIN")

    def tearDown(self):
        if self.saved is None:
            os.environ.pop("MODELMUX_BIN", None)
        else:
            os.environ["MODELMUX_BIN"] = self.saved

    def test_env_must_name_an_executable(self):
        with tempfile.NamedTemporaryFile() as f:
            os.environ["MODELMUX_BIN"] = f.name
            with self.assertRaisesRegex(BinaryNotFoundError, "MODELMUX_BIN"):
                find_binary()
            os.chmod(f.name, 0o755)
            self.assertEqual(find_binary(), f.name)

    def test_a_package_without_the_wheels_binary_names_the_fix(self):
        # The package's files alone (copied, or on PYTHONPATH), outside any checkout.
        os.environ.pop("MODELMUX_BIN", None)
        package = os.path.join(os.path.dirname(__file__), "..", "modelmux")
        with tempfile.TemporaryDirectory() as d:
            shutil.copytree(package, os.path.join(d, "site-packages", "modelmux"))
            env = {k: v for k, v in worker_env().items() if k != "MODELMUX_BIN"}
            env["PYTHONPATH"] = os.path.join(d, "site-packages")
            out = subprocess.run(
                [sys.executable, "-m", "modelmux", "serve"],
                env=env,
                cwd=d,
                capture_output=True,
                text=True,
                timeout=60,
            )
        self.assertEqual(out.returncode, 127, out.stderr)
        for fix in ("scripts/build-python-wheel", "pip install ./python", "MODELMUX_BIN"):
            self.assertIn(fix, out.stderr)

    def _copied_package(self, d: str, code: str) -> subprocess.CompletedProcess[str]:
        """Runs `code` with the package copied to `d/site/modelmux`, away from the checkout."""
        package = os.path.join(os.path.dirname(__file__), "..", "modelmux")
        shutil.copytree(package, os.path.join(d, "site", "modelmux"))
        env = {k: v for k, v in worker_env().items() if k != "MODELMUX_BIN"}
        env["PYTHONPATH"] = os.path.join(d, "site")
        return subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=d, capture_output=True, text=True, timeout=60
        )

    def test_the_binary_a_wheel_installs_in_the_scripts_directory_is_found(self):
        # Where pip puts a maturin wheel's binary: the environment's scripts directory
        # (sysconfig's "scripts" path, stood in for here), or bin/ beside the package's root
        # for `pip install --target`.
        with tempfile.TemporaryDirectory() as d:
            scripts = os.path.join(d, "scripts")
            os.mkdir(scripts)
            binary = executable(os.path.join(scripts, "modelmux"), "#!/bin/sh\n")
            code = (
                "import sysconfig\n"
                "real = sysconfig.get_path\n"
                f"sysconfig.get_path = lambda name, *a: {scripts!r} if name == 'scripts' "
                "else real(name, *a)\n"
                "from modelmux._binary import find_binary\n"
                "print(find_binary())\n"
            )
            out = self._copied_package(d, code)
            self.assertEqual(out.stdout.strip(), binary, out.stderr)
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "site", "bin"))
            binary = executable(os.path.join(d, "site", "bin", "modelmux"), "#!/bin/sh\n")
            out = self._copied_package(d, "from modelmux._binary import find_binary\nprint(find_binary())")
            self.assertEqual(out.stdout.strip(), binary, out.stderr)

    def test_a_checkout_prefers_its_own_build(self):
        from modelmux._binary import candidates, checkout

        repo = checkout()
        self.assertIsNotNone(repo)
        places = [str(p) for p in candidates()]
        self.assertEqual(
            places[:2],
            [os.path.join(repo, "target", "release", "modelmux"), os.path.join(repo, "target", "debug", "modelmux")],
        )
        self.assertIn(os.path.join(sysconfig.get_path("scripts"), "modelmux"), places)

    def test_the_version_is_the_cargo_workspaces(self):
        import tomllib

        import modelmux

        with open(os.path.join(PYTHON_DIR, "..", "Cargo.toml"), "rb") as f:
            cargo = tomllib.load(f)["workspace"]["package"]["version"]
        self.assertEqual(modelmux.__version__, cargo)
        # Away from the checkout, the installed distribution's metadata says it (none here).
        with tempfile.TemporaryDirectory() as d:
            out = self._copied_package(d, "import modelmux; print(modelmux.__version__)")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.strip(), out.stderr)

    def test_python_m_modelmux_execs_the_binary_with_its_arguments(self):
        with tempfile.TemporaryDirectory() as d:
            script = '#!/bin/sh\necho "$0|$*|$MODELMUX_PYTHON"\n'
            binary = executable(os.path.join(d, "modelmux"), script)
            out = subprocess.run(
                [sys.executable, "-m", "modelmux", "serve", "x.yaml"],
                env=worker_env(MODELMUX_BIN=binary),
                capture_output=True,
                text=True,
                timeout=30,
            )
        run, args, python = out.stdout.strip().split("|")
        self.assertEqual((run, args), (binary, "serve x.yaml"))
        self.assertEqual(os.path.realpath(python), os.path.realpath(sys.executable))

    def test_python_m_modelmux_explains_a_missing_binary(self):
        out = subprocess.run(
            [sys.executable, "-m", "modelmux"],
            env=worker_env(MODELMUX_BIN="/nonexistent/modelmux"),
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(out.returncode, 127)
        self.assertIn("MODELMUX_BIN=/nonexistent/modelmux is not an executable file", out.stderr)


if __name__ == "__main__":
    unittest.main()

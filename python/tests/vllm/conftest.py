"""Fixtures of the vLLM entrypoint tests ported to `modelmux serve` (see test_lora_adapters.py).

vLLM's `RemoteOpenAIServer(MODEL_NAME, args)` starts `vllm serve` with CLI flags; here
`modelmux_server(...)` writes a modelmux YAML config (kind: llm, the test GGUF as the base model
`smollm2`), starts `modelmux serve` on a free port, waits for `GET /health` to answer 200, and
stops the server when the module's tests are done, even when they fail. Its log is printed when
it fails to start.

Needed: MODELMUX_TEST_GGUF (the base model) and MODELMUX_TEST_ADAPTERS (the generated test
adapters; `source /tmp/testenv.sh` or scripts/test sets both), and the binary, from
$MODELMUX_BIN or else target/debug/modelmux (`cargo build --bin modelmux`). Anything missing
fails the tests: none is ever skipped.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import openai
import pytest
import requests

REPO = Path(__file__).resolve().parents[3]
BASE_MODEL = "smollm2"
STARTUP_TIMEOUT_S = 180
# vLLM's "/not/an/adapter" must be below an allowed source for modelmux to answer it 404 (as vLLM
# does) rather than 403; and an allowed_sources entry must be a directory that exists when the
# server starts (modelmux refuses a config naming a missing one).
NOT_AN_ADAPTER_ROOT = Path("/not")


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"${name} is not set: `source /tmp/testenv.sh` (or run scripts/test) first",
            pytrace=False,
        )
    return value


def _binary() -> Path:
    binary = Path(os.environ.get("MODELMUX_BIN") or REPO / "target" / "debug" / "modelmux")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(
            f"no modelmux binary at {binary}: `cargo build --bin modelmux`, or set $MODELMUX_BIN",
            pytrace=False,
        )
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelmuxServer:
    """A running `modelmux serve`: what vLLM's RemoteOpenAIServer offers the tests."""

    # vLLM's RemoteOpenAIServer.DUMMY_API_KEY (modelmux needs no key here: it is sent and ignored)
    DUMMY_API_KEY = "token-abc123"

    def __init__(self, port: int):
        self.port = port
        self.url_root = f"http://127.0.0.1:{port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def get_async_client(self, **kwargs) -> openai.AsyncOpenAI:
        # As vLLM's: no retries (an error reaches the test as it is), a long timeout.
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(
            base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs
        )

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """Registers `lora_name` for `lora_path` (what vLLM's `--lora-modules` does at startup)."""
        r = requests.post(
            self.url_for("v1", "load_lora_adapter"),
            json={"lora_name": lora_name, "lora_path": lora_path},
            timeout=120,
        )
        assert r.status_code == 200 and "success" in r.text, (r.status_code, r.text)


@contextlib.contextmanager
def _not_an_adapter_root():
    """Makes /not (empty) for the server's allowed_sources if it is missing; removes it after."""
    made = False
    if not NOT_AN_ADAPTER_ROOT.is_dir():
        try:
            NOT_AN_ADAPTER_ROOT.mkdir()
        except OSError as e:
            pytest.fail(
                f"cannot make {NOT_AN_ADAPTER_ROOT} (an allowed_sources entry, so that vLLM's "
                f"'/not/an/adapter' is answered 404): {e}",
                pytrace=False,
            )
        made = True
    try:
        yield
    finally:
        if made:
            with contextlib.suppress(OSError):
                NOT_AN_ADAPTER_ROOT.rmdir()


@contextlib.contextmanager
def modelmux_server(tmp_path_factory, *, max_num_seqs: int, max_num_adapters_per_replica: int):
    """`modelmux serve` for the base model `smollm2` with dynamic adapter loading."""
    gguf = _env("MODELMUX_TEST_GGUF")
    binary = _binary()
    workdir = tmp_path_factory.mktemp("modelmux-server")
    # Empty: /v1/models lists only the base model and the names registered by the tests.
    repository = workdir / "adapters"
    repository.mkdir()
    port = _free_port()
    # trust_local_users: vLLM's server, which these tests were written for, has no admin
    # token, so its adapter API (/v1/load_lora_adapter) is open to local clients; so here.
    # allowed_sources: the pytest base temp dir (every tmp_path and the zephyr_lora_files copy
    # lie below it) and /not (vLLM's "/not/an/adapter").
    basetemp = tmp_path_factory.getbasetemp()
    config = workdir / "modelmux.yaml"
    config.write_text(
        f"""\
http_options: {{port: {port}, trust_local_users: true}}
applications:
  - name: llm
    deployments:
      - name: LLMServer
        num_replicas: 1
        model:
          kind: llm
          model_loading_config: {{model_id: {BASE_MODEL}, model_source: '{gguf}'}}
          lora_config:
            dynamic_lora_loading_path: '{repository}'
            allowed_sources: ['{basetemp}', '{NOT_AN_ADAPTER_ROOT}']
            max_num_adapters_per_replica: {max_num_adapters_per_replica}
          engine_kwargs: {{max_num_seqs: {max_num_seqs}, max_model_len: 8192}}
"""
    )
    log_path = workdir / "modelmux.log"
    with _not_an_adapter_root(), open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(binary), "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
        )
        try:
            server = ModelmuxServer(port)
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                if process.poll() is not None:
                    _fail_to_start(f"modelmux serve exited with {process.returncode}", log_path)
                with contextlib.suppress(requests.RequestException):
                    if requests.get(server.url_for("health"), timeout=5).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    _fail_to_start(f"/health not 200 after {STARTUP_TIMEOUT_S}s", log_path)
                time.sleep(0.2)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def zephyr_lora_server(tmp_path_factory, zephyr_lora_files: str, *, max_num_seqs: int):
    """vLLM's `--enable-lora --lora-modules zephyr-lora=<path> --max-cpu-loras 2`: a server
    with 2 adapter slots and "zephyr-lora" registered. The static `--lora-modules` has no
    modelmux YAML key: the name is registered with the dynamic API once the server is up."""
    with modelmux_server(tmp_path_factory, max_num_seqs=max_num_seqs,
                         max_num_adapters_per_replica=2) as remote_server:
        remote_server.load_lora_adapter("zephyr-lora", zephyr_lora_files)
        yield remote_server


def _fail_to_start(why: str, log_path: Path):
    log = log_path.read_text(errors="replace")
    print(f"--- modelmux serve log ({log_path}) ---\n{log}")
    pytest.fail(f"{why}; its log:\n{log[-20000:]}", pytrace=False)


@pytest.fixture(scope="session")
def zephyr_lora_files(tmp_path_factory) -> str:
    """vLLM's fixture downloads typeof/zephyr-7b-beta-lora; here: a copy of the test adapter
    `pirate` (SmolLM2, rank 8, q_proj/v_proj) in a temp dir, as a str like vLLM's."""
    source = Path(_env("MODELMUX_TEST_ADAPTERS")) / "pirate"
    if not (source / "adapter_config.json").is_file():
        pytest.fail(f"no test adapter at {source}", pytrace=False)
    target = tmp_path_factory.mktemp("zephyr-lora") / "zephyr-7b-beta-lora"
    shutil.copytree(source, target)
    return str(target)

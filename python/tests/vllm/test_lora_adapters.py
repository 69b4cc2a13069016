# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Ported from vLLM's tests/entrypoints/openai/test_lora_adapters.py at commit
# bb80f141f2f8b970759157b4bb0b51d9c191def6 (https://github.com/vllm-project/vllm), to run
# against `modelmux serve`. Every vLLM test function below is vLLM's, with its name, its
# assertions, its `pytest.raises(...)` types and `match=` strings as they are. Changed:
# - the imports (`RemoteOpenAIServer` from vLLM's tests/utils.py becomes conftest.py's
#   `modelmux_server` (through `zephyr_lora_server`), which writes a modelmux YAML config and
#   starts `modelmux serve`);
# - MODEL_NAME: our base model id is "smollm2" (the test GGUF, $MODELMUX_TEST_GGUF);
# - `zephyr_lora_files` (conftest.py): a copy of the test adapter $MODELMUX_TEST_ADAPTERS/pirate
#   instead of a download of typeof/zephyr-7b-beta-lora;
# - the server fixture: vLLM's flags become the YAML config: `--max-cpu-loras 2` is
#   `lora_config.max_num_adapters_per_replica: 2`, `--max-num-seqs 64` is
#   `engine_kwargs.max_num_seqs: 64`, `--max-model-len 8192` is `engine_kwargs.max_model_len`;
#   `--enable-lora` and VLLM_ALLOW_RUNTIME_LORA_UPDATING are `lora_config` itself (its
#   `dynamic_lora_loading_path` an empty temp dir, so /v1/models lists only the base model and
#   the registered names; its `allowed_sources` the pytest temp dir and /not); `--dtype`,
#   `--enforce-eager` and `--max-lora-rank` have no modelmux equivalent (a CPU engine; no rank
#   cap below the config's 1..=4096). vLLM's `--lora-modules` (the static "zephyr-lora") has no
#   YAML key: the fixture registers it with one POST /v1/load_lora_adapter once the server is up.
#   The fixture's `params=[True]`, its VLLM_USE_V1 setting and the `monkeypatch_module` fixture
#   that made it (vLLM's engine choice) are gone.
#   /not must exist for it to be an allowed source (modelmux refuses a config naming a missing
#   directory): conftest.py makes it, empty, when it is missing, and removes it afterwards.
# - xfail(strict=True, raises=AssertionError) marks on the cases whose vLLM assertion cannot
#   hold on modelmux, each with its reason (test_dynamic_lora_badrequests is parametrized with
#   BADREQUEST_PARAMS: vLLM's BADREQUEST_CASES, unchanged, each in a pytest.param carrying its
#   mark); next to them, tests of our own (named `..._on_modelmux`, marked
#   "modelmux's own" below) check what modelmux does instead.

import asyncio
import json
import re
import shutil
from contextlib import suppress

import openai  # use the official client for correctness check
import pytest
import pytest_asyncio
from conftest import zephyr_lora_server

# any model with a chat template should work here
MODEL_NAME = "smollm2"

BADREQUEST_CASES = [
    (
        "test_rank",
        {
            "r": 1024
        },
        "is greater than max_lora_rank",
    ),
    (
        "test_bias",
        {
            "bias": "all"
        },
        "Adapter bias cannot be used without bias_enabled",
    ),
    ("test_dora", {
        "use_dora": True
    }, "does not yet support DoRA"),
    (
        "test_modules_to_save",
        {
            "modules_to_save": ["lm_head"]
        },
        "only supports modules_to_save being None",
    ),
]

# Why each of vLLM's messages cannot match: modelmux refuses all four with 400 (as vLLM), but in
# its own words, naming the setting (checked by test_dynamic_lora_badrequests_on_modelmux).
BADREQUEST_XFAIL_REASONS = {
    "test_rank": (
        "modelmux has no max_lora_rank (a config accepts r in 1..=4096): r=1024 is refused "
        "because the rank-8 weights do not match it ('lora_A is [8, 576] ... but rank 1024 ... "
        "needs [1024, 576]'), not as 'greater than max_lora_rank'"
    ),
    "test_bias": (
        "modelmux has no bias_enabled option (no LoRA bias at all): the message is "
        "\"adapter_config.json: bias 'all' is not supported (only \\\"none\\\")\""
    ),
    "test_dora": (
        "modelmux's message is \"adapter_config.json: 'use_dora' = true is not supported\""
    ),
    "test_modules_to_save": (
        "modelmux's message is "
        "\"adapter_config.json: 'modules_to_save' = [\\\"lm_head\\\"] is not supported\""
    ),
}

BADREQUEST_PARAMS = [
    pytest.param(
        *case,
        marks=pytest.mark.xfail(strict=True, raises=AssertionError,
                                reason=BADREQUEST_XFAIL_REASONS[case[0]]),
        id=case[0],
    )
    for case in BADREQUEST_CASES
]

# modelmux's own: the same configs, refused with 400 and a message naming the setting.
MODELMUX_BADREQUEST_MESSAGES = {
    "test_rank": r"rank 1024 on this base model needs \[1024, 576\]",
    "test_bias": r"adapter_config\.json: bias 'all' is not supported",
    "test_dora": r"adapter_config\.json: 'use_dora' = true is not supported",
    "test_modules_to_save":
    r"adapter_config\.json: 'modules_to_save' = \[\"lm_head\"\] is not supported",
}


# vLLM's tests send prompt=["Hello there", "Foo bar bazz buzz"] in one request (a batch);
# modelmux's own tests send it both as that batch and as one request per prompt, and check
# what comes back.
PROMPTS = ["Hello there", "Foo bar bazz buzz"]


async def complete_each(client: openai.AsyncOpenAI, model: str, **kwargs):
    """vLLM's `completions.create(prompt=PROMPTS, ...)`, as one request per prompt and as the
    batch, each answer checked to be one choice per prompt."""
    batch = await client.completions.create(model=model, prompt=PROMPTS, max_tokens=5, **kwargs)
    assert [c.index for c in batch.choices] == list(range(len(PROMPTS)))
    alone = await asyncio.gather(*(client.completions.create(
        model=model, prompt=prompt, max_tokens=5, **kwargs) for prompt in PROMPTS))
    return [*alone, batch]


@pytest.fixture(scope="module")
def server_with_lora_modules_json(tmp_path_factory, zephyr_lora_files):
    # vLLM: --enable-lora --lora-modules '{"name": "zephyr-lora", ...}' --max-lora-rank 64
    # --max-cpu-loras 2 --max-num-seqs 64, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.
    with zephyr_lora_server(tmp_path_factory, zephyr_lora_files,
                            max_num_seqs=64) as remote_server:
        yield remote_server


@pytest_asyncio.fixture
async def client(server_with_lora_modules_json):
    async with server_with_lora_modules_json.get_async_client(
    ) as async_client:
        yield async_client


@pytest.mark.asyncio
async def test_static_lora_lineage(client: openai.AsyncOpenAI,
                                   zephyr_lora_files):
    models = await client.models.list()
    models = models.data
    served_model = models[0]
    lora_models = models[1:]
    assert served_model.id == MODEL_NAME
    assert served_model.root == MODEL_NAME
    assert served_model.parent is None
    assert all(lora_model.root == zephyr_lora_files
               for lora_model in lora_models)
    assert all(lora_model.parent == MODEL_NAME for lora_model in lora_models)
    assert lora_models[0].id == "zephyr-lora"


@pytest.mark.asyncio
async def test_dynamic_lora_lineage(client: openai.AsyncOpenAI,
                                    zephyr_lora_files):

    response = await client.post("load_lora_adapter",
                                 cast_to=str,
                                 body={
                                     "lora_name": "zephyr-lora-3",
                                     "lora_path": zephyr_lora_files
                                 })
    # Ensure adapter loads before querying /models
    assert "success" in response

    models = await client.models.list()
    models = models.data
    dynamic_lora_model = models[-1]
    assert dynamic_lora_model.root == zephyr_lora_files
    assert dynamic_lora_model.parent == MODEL_NAME
    assert dynamic_lora_model.id == "zephyr-lora-3"


@pytest.mark.asyncio
async def test_dynamic_lora_not_found(client: openai.AsyncOpenAI):
    with pytest.raises(openai.NotFoundError):
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": "notfound",
                              "lora_path": "/not/an/adapter"
                          })


@pytest.mark.asyncio
async def test_dynamic_lora_outside_allowed_sources_on_modelmux(
        client: openai.AsyncOpenAI, tmp_path):
    """modelmux's own: a path below no `lora_config.allowed_sources` entry is refused with 403
    naming the rule, before anything is read (why the fixture allows /not: vLLM has no such
    rule, and answers 404 for the missing "/not/an/adapter")."""
    with pytest.raises(openai.PermissionDeniedError) as e:
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": "outside",
                              "lora_path": "/etc/an/adapter"
                          })
    assert "refused by lora_config.allowed_sources" in e.value.body["message"]
    models = (await client.models.list()).data
    assert "outside" not in [m.id for m in models]


@pytest.mark.asyncio
async def test_dynamic_lora_invalid_files(client: openai.AsyncOpenAI,
                                          tmp_path):
    invalid_files = tmp_path / "invalid_files"
    invalid_files.mkdir()
    (invalid_files / "adapter_config.json").write_text("this is not json")

    with pytest.raises(openai.BadRequestError):
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": "invalid-json",
                              "lora_path": str(invalid_files)
                          })


@pytest.mark.asyncio
async def test_dynamic_lora_invalid_files_on_modelmux(
        client: openai.AsyncOpenAI, tmp_path):
    """modelmux's own: the 400 names the file and what is wrong with it (the config is read
    before the weights, so their absence does not make it a 404), and the name is not left
    registered."""
    invalid_files = tmp_path / "invalid_files"
    invalid_files.mkdir()
    (invalid_files / "adapter_config.json").write_text("this is not json")

    with pytest.raises(openai.BadRequestError) as e:
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": "invalid-json-2",
                              "lora_path": str(invalid_files)
                          })
    assert "adapter_config.json is not valid JSON" in e.value.body["message"]
    models = (await client.models.list()).data
    assert "invalid-json-2" not in [m.id for m in models]


@pytest.mark.asyncio
@pytest.mark.parametrize("test_name,config_change,expected_error",
                         BADREQUEST_PARAMS)
async def test_dynamic_lora_badrequests(client: openai.AsyncOpenAI, tmp_path,
                                        zephyr_lora_files, test_name: str,
                                        config_change: dict,
                                        expected_error: str):
    # Create test directory
    test_dir = tmp_path / test_name

    # Copy adapter files
    shutil.copytree(zephyr_lora_files, test_dir)

    # Load and modify configuration
    config_path = test_dir / "adapter_config.json"
    with open(config_path) as f:
        adapter_config = json.load(f)
    # Apply configuration changes
    adapter_config.update(config_change)

    # Save modified configuration
    with open(config_path, "w") as f:
        json.dump(adapter_config, f)

    # Test loading the adapter
    with pytest.raises(openai.BadRequestError, match=expected_error):
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": test_name,
                              "lora_path": str(test_dir)
                          })


@pytest.mark.asyncio
@pytest.mark.parametrize("test_name,config_change,expected_error",
                         BADREQUEST_CASES,
                         ids=[case[0] for case in BADREQUEST_CASES])
async def test_dynamic_lora_badrequests_on_modelmux(
        client: openai.AsyncOpenAI, tmp_path, zephyr_lora_files,
        test_name: str, config_change: dict, expected_error: str):
    """modelmux's own: vLLM's four bad configs, each refused with 400 and a message naming the
    setting (vLLM's `expected_error` is not modelmux's wording), and not left registered."""
    test_dir = tmp_path / test_name
    shutil.copytree(zephyr_lora_files, test_dir)
    config_path = test_dir / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config.update(config_change)
    config_path.write_text(json.dumps(adapter_config))

    name = f"{test_name}-on-modelmux"
    with pytest.raises(openai.BadRequestError) as e:
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": name,
                              "lora_path": str(test_dir)
                          })
    assert e.value.status_code == 400
    assert re.search(MODELMUX_BADREQUEST_MESSAGES[test_name],
                     e.value.body["message"]), e.value.body
    models = (await client.models.list()).data
    assert name not in [m.id for m in models]


@pytest.mark.asyncio
async def test_multiple_lora_adapters(client: openai.AsyncOpenAI, tmp_path,
                                      zephyr_lora_files):
    """Validate that many loras can be dynamically registered and inferenced
    with concurrently"""

    # This test file configures the server with --max-cpu-loras=2 and this test
    # will concurrently load 10 adapters, so it should flex the LRU cache
    async def load_and_run_adapter(adapter_name: str):
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": adapter_name,
                              "lora_path": str(zephyr_lora_files)
                          })
        for _ in range(3):
            await client.completions.create(
                model=adapter_name,
                prompt=["Hello there", "Foo bar bazz buzz"],
                max_tokens=5,
            )

    lora_tasks = []
    for i in range(10):
        lora_tasks.append(
            asyncio.create_task(load_and_run_adapter(f"adapter_{i}")))

    results, _ = await asyncio.wait(lora_tasks)

    for r in results:
        assert not isinstance(r, Exception), f"Got exception {r}"


@pytest.mark.asyncio
async def test_multiple_lora_adapters_on_modelmux(client: openai.AsyncOpenAI,
                                                  zephyr_lora_files):
    """modelmux's own: vLLM's test above, with its tasks' results checked. (vLLM's `results`
    are the finished tasks, never exceptions, so its assertion cannot fail whatever the
    completions answered. Here each load must answer "success" and each completion, batched
    and one prompt per request, text.)"""

    async def load_and_run_adapter(adapter_name: str):
        response = await client.post("load_lora_adapter",
                                     cast_to=str,
                                     body={
                                         "lora_name": adapter_name,
                                         "lora_path": str(zephyr_lora_files)
                                     })
        assert "success" in response
        for _ in range(3):
            for completion in await complete_each(client, adapter_name):
                assert completion.model == adapter_name
                assert completion.choices[0].text

    await asyncio.gather(
        *(load_and_run_adapter(f"many_{i}") for i in range(10)))
    models = [m.id for m in (await client.models.list()).data]
    assert all(f"many_{i}" in models for i in range(10))


@pytest.mark.asyncio
async def test_loading_invalid_adapters_does_not_break_others(
        client: openai.AsyncOpenAI, tmp_path, zephyr_lora_files):

    invalid_files = tmp_path / "invalid_files"
    invalid_files.mkdir()
    (invalid_files / "adapter_config.json").write_text("this is not json")

    stop_good_requests_event = asyncio.Event()

    async def run_good_requests(client):
        # Run chat completions requests until event set

        results = []

        while not stop_good_requests_event.is_set():
            try:
                batch = await client.completions.create(
                    model="zephyr-lora",
                    prompt=["Hello there", "Foo bar bazz buzz"],
                    max_tokens=5,
                )
                results.append(batch)
            except Exception as e:
                results.append(e)

        return results

    # Create task to run good requests
    good_task = asyncio.create_task(run_good_requests(client))

    # Run a bunch of bad adapter loads
    for _ in range(25):
        with suppress(openai.NotFoundError):
            await client.post("load_lora_adapter",
                              cast_to=str,
                              body={
                                  "lora_name": "notfound",
                                  "lora_path": "/not/an/adapter"
                              })
    for _ in range(25):
        with suppress(openai.BadRequestError):
            await client.post("load_lora_adapter",
                              cast_to=str,
                              body={
                                  "lora_name": "invalid",
                                  "lora_path": str(invalid_files)
                              })

    # Ensure all the running requests with lora adapters succeeded
    stop_good_requests_event.set()
    results = await good_task
    for r in results:
        assert not isinstance(r, Exception), f"Got exception {r}"

    # Ensure we can load another adapter and run it
    await client.post("load_lora_adapter",
                      cast_to=str,
                      body={
                          "lora_name": "valid",
                          "lora_path": zephyr_lora_files
                      })
    await client.completions.create(
        model="valid",
        prompt=["Hello there", "Foo bar bazz buzz"],
        max_tokens=5,
    )


@pytest.mark.asyncio
async def test_loading_invalid_adapters_does_not_break_others_on_modelmux(
        client: openai.AsyncOpenAI, tmp_path, zephyr_lora_files):
    """modelmux's own: vLLM's test above with one prompt per request, and each bad load's
    status checked (404 for the missing path, 400 for the config that is not JSON)."""
    invalid_files = tmp_path / "invalid_files"
    invalid_files.mkdir()
    (invalid_files / "adapter_config.json").write_text("this is not json")

    stop_good_requests_event = asyncio.Event()

    async def run_good_requests(client):
        results = []
        while not stop_good_requests_event.is_set():
            try:
                results.extend(await complete_each(client, "zephyr-lora"))
            except Exception as e:
                results.append(e)
        return results

    good_task = asyncio.create_task(run_good_requests(client))

    for _ in range(25):
        with pytest.raises(openai.NotFoundError):
            await client.post("load_lora_adapter",
                              cast_to=str,
                              body={
                                  "lora_name": "notfound",
                                  "lora_path": "/not/an/adapter"
                              })
    for _ in range(25):
        with pytest.raises(openai.BadRequestError):
            await client.post("load_lora_adapter",
                              cast_to=str,
                              body={
                                  "lora_name": "invalid",
                                  "lora_path": str(invalid_files)
                              })

    stop_good_requests_event.set()
    results = await good_task
    assert results
    for r in results:
        assert not isinstance(r, Exception), f"Got exception {r}"
        assert r.choices[0].text

    models = [m.id for m in (await client.models.list()).data]
    assert "notfound" not in models and "invalid" not in models

    response = await client.post("load_lora_adapter",
                                 cast_to=str,
                                 body={
                                     "lora_name": "valid-on-modelmux",
                                     "lora_path": zephyr_lora_files
                                 })
    assert "success" in response
    for completion in await complete_each(client, "valid-on-modelmux"):
        assert completion.choices[0].text


@pytest.mark.asyncio
async def test_beam_search_with_lora_adapters(
    client: openai.AsyncOpenAI,
    tmp_path,
    zephyr_lora_files,
):
    """Validate that async beam search can be used with lora."""

    async def load_and_run_adapter(adapter_name: str):
        await client.post("load_lora_adapter",
                          cast_to=str,
                          body={
                              "lora_name": adapter_name,
                              "lora_path": str(zephyr_lora_files)
                          })
        for _ in range(3):
            await client.completions.create(
                model=adapter_name,
                prompt=["Hello there", "Foo bar bazz buzz"],
                max_tokens=5,
                extra_body=dict(use_beam_search=True),
            )

    lora_tasks = []
    for i in range(3):
        lora_tasks.append(
            asyncio.create_task(load_and_run_adapter(f"adapter_{i}")))

    results, _ = await asyncio.wait(lora_tasks)

    for r in results:
        assert not isinstance(r, Exception), f"Got exception {r}"


@pytest.mark.asyncio
async def test_beam_search_with_lora_adapters_on_modelmux(
        client: openai.AsyncOpenAI, zephyr_lora_files):
    """modelmux's own: there is no beam search, and `use_beam_search` is refused with 400
    naming the parameter, for an adapter as for the base model. (vLLM's test above passes on
    modelmux only because its assertion cannot fail: its `results` are the finished tasks,
    whose exceptions are never looked at. Its loads of adapter_0..2 are 400s too, those names
    being registered by test_multiple_lora_adapters already, as they would be on vLLM.)"""
    response = await client.post("load_lora_adapter",
                                 cast_to=str,
                                 body={
                                     "lora_name": "beam",
                                     "lora_path": str(zephyr_lora_files)
                                 })
    assert "success" in response
    for model in ["beam", MODEL_NAME]:
        with pytest.raises(openai.BadRequestError) as e:
            await client.completions.create(
                model=model,
                prompt="Hello there",
                max_tokens=5,
                extra_body=dict(use_beam_search=True),
            )
        assert e.value.param == "use_beam_search"
        assert "unknown field `use_beam_search`" in e.value.body["message"]
    # Without it, the same requests are served.
    for completion in await complete_each(client, "beam"):
        assert completion.choices[0].text

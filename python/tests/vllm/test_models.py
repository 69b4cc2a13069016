# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
#
# Ported from vLLM's tests/entrypoints/openai/test_models.py at commit
# 0091c9502ffb9f6761588a21b8d917db8ede4990 (https://github.com/vllm-project/vllm), to run
# against `modelmux serve`. test_check_models is vLLM's, with its name and assertions as they
# are. Changed:
# - the imports (`RemoteOpenAIServer` becomes conftest.py's `zephyr_lora_server`; no
#   huggingface_hub);
# - MODEL_NAME: our base model id is "smollm2";
# - `zephyr_lora_files`: vLLM's module fixture downloads typeof/zephyr-7b-beta-lora; conftest.py's
#   copies the test adapter $MODELMUX_TEST_ADAPTERS/pirate into a temp dir;
# - the server fixture: `--max-cpu-loras 2` is `lora_config.max_num_adapters_per_replica: 2`,
#   `--max-num-seqs 128` is `engine_kwargs.max_num_seqs: 128` (see conftest.py for the rest);
#   vLLM's `--lora-modules zephyr-lora=<path>` has no YAML key: the fixture registers it with one
#   POST /v1/load_lora_adapter once the server is up.
# (vLLM's test_lora_resolvers.py, in the same directory, is not ported: it drives vLLM's Python
# internals, OpenAIServingCompletion with a mocked engine and LoRAResolverRegistry, not the HTTP
# API.)

import openai  # use the official client for correctness check
import pytest
import pytest_asyncio
from conftest import zephyr_lora_server

# any model with a chat template should work here
MODEL_NAME = "smollm2"


@pytest.fixture(scope="module")
def server(tmp_path_factory, zephyr_lora_files):
    # vLLM: --enable-lora --lora-modules zephyr-lora=<path> --max-lora-rank 64
    # --max-cpu-loras 2 --max-num-seqs 128
    with zephyr_lora_server(tmp_path_factory, zephyr_lora_files,
                            max_num_seqs=128) as remote_server:
        yield remote_server


@pytest_asyncio.fixture
async def client(server):
    async with server.get_async_client() as async_client:
        yield async_client


@pytest.mark.asyncio
async def test_check_models(client: openai.AsyncOpenAI, zephyr_lora_files):
    models = await client.models.list()
    models = models.data
    served_model = models[0]
    lora_models = models[1:]
    assert served_model.id == MODEL_NAME
    assert served_model.root == MODEL_NAME
    assert all(lora_model.root == zephyr_lora_files
               for lora_model in lora_models)
    assert lora_models[0].id == "zephyr-lora"

"""The official `openai` Python client against a running `modelmux serve` (kind: llm).

Run by crates/cli/tests/cli/llm.rs: python openai_client.py <base_url> <expected.json>, where
expected.json holds the engine's own greedy answers ({"question", "base", "pirate", "max_tokens"}).
Any failed check raises, and the process exits non-zero. The checks are `check(...)` calls, not
`assert` statements, so they run under `python -O` (PYTHONOPTIMIZE) too; the Rust test runs this
script with PYTHONOPTIMIZE=1 and refuses a bare `assert` in it.
"""

import json
import sys
import urllib.request

import openai

base_url, expected_path = sys.argv[1], sys.argv[2]
expected = json.load(open(expected_path))
question, n = expected["question"], expected["max_tokens"]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
messages = [{"role": "user", "content": question}]


def check(condition, *context):
    """Raises AssertionError with `context` unless `condition` (never skipped, unlike assert)."""
    if not condition:
        raise AssertionError(*context) if context else AssertionError("check failed")


def chat(model, **kw):
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=n, temperature=0, **kw
    )


# Chat, base model and adapter: the engine's own answers.
base = chat("smollm2")
check(base.choices[0].message.content == expected["base"], (base, expected))
check(base.choices[0].finish_reason in ("stop", "length"))
check(base.usage.completion_tokens > 0 and base.usage.prompt_tokens > 0)
check(base.id.startswith("chatcmpl-"))
pirate = chat("smollm2:pirate")
check(pirate.choices[0].message.content == expected["pirate"], (pirate, expected))
check(expected["pirate"] != expected["base"])

# Streaming: the chunks add up to the whole answer; usage at the end when asked.
stream = chat(
    "smollm2:pirate", stream=True, stream_options={"include_usage": True}
)
text, usage, reasons = "", None, []
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        if choice.finish_reason:
            reasons.append(choice.finish_reason)
check(text == expected["pirate"], (text, expected))
check(reasons == [pirate.choices[0].finish_reason], reasons)
check(usage is not None and usage.completion_tokens == pirate.usage.completion_tokens)

# Completions with the chat's prompt as token ids.
request = urllib.request.Request(
    base_url + "/tokenize",
    data=json.dumps({"model": "smollm2", "messages": messages}).encode(),
    headers={"content-type": "application/json"},
)
tokens = json.load(urllib.request.urlopen(request))["tokens"]
completion = client.completions.create(
    model="smollm2", prompt=tokens, max_tokens=n, temperature=0
)
check(completion.choices[0].text == expected["base"], completion)

# The models: the base and every adapter of the repository, each with its parent.
models = {m.id: m for m in client.models.list()}
check("smollm2" in models, models)
for adapter in ("pirate", "tutor", "poet", "chef"):
    card = models["smollm2:" + adapter]
    check(card.model_extra.get("parent") == "smollm2", card)

# Embeddings (the client asks for base64 and decodes it): unit vectors, one per input.
emb = client.embeddings.create(model="smollm2:pirate", input=["hello", "goodbye"])
check([d.index for d in emb.data] == [0, 1], emb)
for d in emb.data:
    check(len(d.embedding) == 576)
    check(abs(sum(v * v for v in d.embedding) - 1.0) < 1e-3)
check(emb.usage.prompt_tokens > 0)

# An unknown adapter is NotFoundError, naming the adapter.
try:
    chat("smollm2:nobody")
    raise AssertionError("an unknown adapter was answered")
except openai.NotFoundError as e:
    check("nobody" in str(e), e)

# Bad parameters are BadRequestError.
bad = [
    dict(max_tokens=-1),
    dict(temperature=5),
    dict(messages=[]),
    dict(n=0),
    dict(messages=[{"role": "user", "content": "x" * (2 << 20)}]),
]
for kw in bad:
    args = dict(model="smollm2", messages=messages, max_tokens=4, temperature=0)
    args.update(kw)
    try:
        client.chat.completions.create(**args)
        raise AssertionError(f"accepted {list(kw)}")
    except openai.BadRequestError as e:
        check(e.status_code == 400)
        check(e.body and e.body.get("message"), e.body)

# n > 1: greedy choices equal the single answer, one per index.
several = chat("smollm2", n=3)
check([c.index for c in several.choices] == [0, 1, 2], several)
check(all(c.message.content == expected["base"] for c in several.choices), several)
check(several.usage.completion_tokens == 3 * base.usage.completion_tokens, several.usage)

# Log probabilities, as the client parses them.
lp = chat("smollm2:pirate", logprobs=True, top_logprobs=2).choices[0].logprobs
check(lp is not None and len(lp.content) > 0, lp)
first = lp.content[0]
check(first.logprob <= 0 and len(first.top_logprobs) == 2, first)
check(first.top_logprobs[0].token == first.token, first)

print("openai client: all checks passed")

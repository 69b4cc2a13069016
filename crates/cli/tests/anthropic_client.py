"""The official `anthropic` Python client's Messages API against a running `modelmux serve`.

Run by crates/cli/tests/cli/llm.rs: python anthropic_client.py <base_url>. Every answer is
checked against the chat completion of the same conversation (greedy), asked for over HTTP:
the same text and the same token counts; `count_tokens` is the prompt the message had. The
checks are `check(...)` calls, not `assert` statements, so they run under `python -O` too.
"""

import json
import sys
import urllib.request

import anthropic
import jsonschema

base_url = sys.argv[1]
client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)
N = 16
# This client version no longer sends `temperature` (the newest models take none); the server
# still does, and greedy decoding is what makes answers comparable.
GREEDY = {"temperature": 0}


def check(condition, *context):
    """Raises AssertionError with `context` unless `condition` (never skipped, unlike assert)."""
    if not condition:
        raise AssertionError(*context) if context else AssertionError("check failed")


def chat(body):
    """The chat completion of `body` (greedy), over plain HTTP."""
    body = dict(body, temperature=0)
    request = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def text_of(message):
    return "".join(block.text for block in message.content if block.type == "text")


def same(message, completion):
    """A message is the chat it translates to: its text and its token counts."""
    check(text_of(message) == (completion["choices"][0]["message"]["content"] or ""),
          (message, completion))
    check(message.usage.input_tokens == completion["usage"]["prompt_tokens"], message.usage)
    check(message.usage.output_tokens == completion["usage"]["completion_tokens"], message.usage)


system, question = "Answer briefly.", "Where is Rome?"
for model in ["smollm2", "smollm2:pirate", "smollm2:poet"]:
    completion = chat({
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": N,
    })
    message = client.messages.create(
        model=model, system=system, max_tokens=N, extra_body=GREEDY,
        messages=[{"role": "user", "content": question}],
    )
    check(message.id.startswith("msg_") and message.role == "assistant", message)
    check(message.stop_reason in ("end_turn", "max_tokens"), message.stop_reason)
    same(message, completion)
    with client.messages.stream(
        model=model, system=system, max_tokens=N, extra_body=GREEDY,
        messages=[{"role": "user", "content": question}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(text == text_of(final), (text, final))
    check(final.stop_reason == message.stop_reason, final)
    same(final, completion)

# Tool use round trip.
tool = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.messages.create(
    model="smollm2:tutor", max_tokens=60, extra_body=GREEDY, messages=ask, tools=[tool],
    tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
)
check(called.stop_reason == "tool_use", called)
uses = [block for block in called.content if block.type == "tool_use"]
check(len(uses) == 1 and uses[0].name == "weather", called.content)
check(isinstance(uses[0].input.get("city"), str), uses[0].input)
with client.messages.stream(
    model="smollm2:tutor", max_tokens=60, extra_body=GREEDY, messages=ask, tools=[tool],
    tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
) as stream:
    streamed = stream.get_final_message()
check([b.input for b in streamed.content if b.type == "tool_use"] == [uses[0].input], streamed)
conversation = ask + [
    {"role": "assistant", "content": [u.model_dump() for u in uses]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 24 C"},
    ]},
]
answer = client.messages.create(
    model="smollm2:tutor", max_tokens=20, extra_body=GREEDY, messages=conversation, tools=[tool]
)
completion = chat({
    "model": "smollm2:tutor",
    "max_tokens": 20,
    "messages": ask + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": uses[0].id, "type": "function",
            "function": {"name": "weather", "arguments": json.dumps(uses[0].input, separators=(",", ":"))},
        }]},
        {"role": "tool", "tool_call_id": uses[0].id, "content": "Sunny, 24 C"},
    ],
    "tools": [{"type": "function", "function": {
        "name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"],
    }}],
})
check(answer.usage.input_tokens == completion["usage"]["prompt_tokens"], answer.usage)
if completion["choices"][0]["message"].get("tool_calls"):
    check(answer.stop_reason == "tool_use", answer)
else:
    same(answer, completion)

# count_tokens: the prompt the same message has, tools included.
for tools in ([], [tool]):
    counted = client.messages.count_tokens(
        model="smollm2:pirate", system=system, messages=conversation, tools=tools
    )
    sent = client.messages.create(
        model="smollm2:pirate", system=system, messages=conversation, tools=tools,
        max_tokens=1, extra_body=GREEDY,
    )
    check(counted.input_tokens == sent.usage.input_tokens, (counted, sent.usage))
check(
    client.messages.count_tokens(model="smollm2", messages=ask, tools=[tool]).input_tokens
    > client.messages.count_tokens(model="smollm2", messages=ask).input_tokens,
    "the tools are counted",
)

# output_config.format: a JSON schema, enforced.
schema = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
formatted = client.messages.create(
    model="smollm2:chef", max_tokens=60, extra_body=GREEDY,
    messages=[{"role": "user", "content": "Name a city and its country."}],
    output_config={"format": {"type": "json_schema", "schema": schema}},
)
jsonschema.validate(json.loads(text_of(formatted)), schema)

# Errors in Anthropic's shape, as the client's exceptions.
try:
    client.messages.create(model="other:thing", max_tokens=4, messages=ask)
    check(False, "an unknown model was served")
except anthropic.NotFoundError as e:
    check(e.body["error"]["type"] == "not_found_error", e.body)
try:
    client.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "robot", "content": "x"}])
    check(False, "a bad role was accepted")
except anthropic.BadRequestError as e:
    check(e.body["error"]["type"] == "invalid_request_error", e.body)
    check("messages[0].role" in e.body["error"]["message"], e.body)
print("anthropic client: all checks passed")

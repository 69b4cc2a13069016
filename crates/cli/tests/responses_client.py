"""The official `openai` Python client's Responses API against a running `modelmux serve`.

Run by crates/cli/tests/cli/llm.rs: python responses_client.py <base_url>. Every answer is
checked against the chat completion of the same conversation (greedy), which the same client
asks for: the same text and the same token counts. The checks are `check(...)` calls, not
`assert` statements, so they run under `python -O` too.
"""

import json
import sys

import jsonschema
import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
N = 16


def check(condition, *context):
    """Raises AssertionError with `context` unless `condition` (never skipped, unlike assert)."""
    if not condition:
        raise AssertionError(*context) if context else AssertionError("check failed")


def chat(model, messages, n=N, **kw):
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=n, temperature=0, **kw
    )


def same(response, completion):
    """A response is the chat it translates to: its text and its token counts."""
    check(response.output_text == (completion.choices[0].message.content or ""),
          (response.output_text, completion.choices[0].message.content))
    check(response.usage.input_tokens == completion.usage.prompt_tokens, response.usage)
    check(response.usage.output_tokens == completion.usage.completion_tokens, response.usage)


question = "What is the capital of France?"
# create and stream, on the base model and two adapters.
for model in ["smollm2", "smollm2:pirate", "smollm2:chef"]:
    completion = chat(model, [{"role": "user", "content": question}])
    response = client.responses.create(
        model=model, input=question, max_output_tokens=N, temperature=0
    )
    check(response.id.startswith("resp_") and response.object == "response", response)
    check(response.status in ("completed", "incomplete"), response.status)
    same(response, completion)
    with client.responses.stream(
        model=model, input=question, max_output_tokens=N, temperature=0
    ) as stream:
        kinds, text, final = [], "", None
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            # Past max_output_tokens the stream ends `response.incomplete` (as OpenAI's does),
            # which get_final_response() does not take: the last event carries the response.
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    check(kinds[0] == "response.created", kinds)
    check(kinds[-1] in ("response.completed", "response.incomplete"), kinds)
    check("response.output_item.added" in kinds and "response.output_text.done" in kinds, kinds)
    check(text == final.output_text, (text, final.output_text))
    same(final, completion)
    stored = client.responses.retrieve(final.id)
    check(stored.output_text == final.output_text, stored)

# Three turns chained by previous_response_id: turn 3 depends on turn 1's content.
turns = [
    "My name is Ada and I live in Lisbon.",
    "What is two plus two?",
    "Repeat my name and my city.",
]
messages, previous = [], None
for i, q in enumerate(turns):
    response = client.responses.create(
        model="smollm2:pirate",
        input=[{"role": "user", "content": q}],
        previous_response_id=previous,
        max_output_tokens=24,
        temperature=0,
    )
    messages.append({"role": "user", "content": q})
    same(response, chat("smollm2:pirate", messages, n=24))
    check(response.previous_response_id == previous, response)
    messages.append({"role": "assistant", "content": response.output_text})
    previous = response.id
# Turn 3 saw turn 1: without the earlier turns the same question answers otherwise.
alone = chat("smollm2:pirate", [{"role": "user", "content": turns[2]}], n=24)
check(alone.choices[0].message.content != messages[-1]["content"], messages[-1])
items = client.responses.input_items.list(previous)
check([i.role for i in items.data] == ["user"], items)
check(items.data[0].content[0].text == turns[2], items)

# A function call round trip.
tool = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
called = client.responses.create(
    model="smollm2",
    input="What is the weather in Paris?",
    tools=[tool],
    tool_choice="required",
    parallel_tool_calls=False,
    max_output_tokens=60,
    temperature=0,
)
calls = [item for item in called.output if item.type == "function_call"]
check(len(calls) == 1 and calls[0].name == "weather", called.output)
arguments = json.loads(calls[0].arguments)
jsonschema.validate(arguments, tool["parameters"])
answer = client.responses.create(
    model="smollm2",
    previous_response_id=called.id,
    input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 C"}],
    max_output_tokens=20,
    temperature=0,
)
same(answer, chat("smollm2", [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].call_id, "type": "function",
         "function": {"name": "weather", "arguments": calls[0].arguments}},
    ]},
    {"role": "tool", "tool_call_id": calls[0].call_id, "content": "Sunny, 24 C"},
], n=20))

# text.format json_schema, validated with jsonschema.
schema = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
formatted = client.responses.create(
    model="smollm2:chef",
    input="Name a city and its country.",
    text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}},
    max_output_tokens=60,
    temperature=0,
)
jsonschema.validate(json.loads(formatted.output_text), schema)

# Bad input: an unknown previous_response_id is a 404; store=False cannot be chained.
try:
    client.responses.create(model="smollm2", input="Hi", previous_response_id="resp_gone")
    check(False, "an unknown previous_response_id was accepted")
except openai.NotFoundError as e:
    check("previous_response_id" in str(e), e)
unstored = client.responses.create(model="smollm2", input="Hi", store=False, max_output_tokens=2)
try:
    client.responses.create(model="smollm2", input="Hi", previous_response_id=unstored.id)
    check(False, "a response stored with store=False was chained")
except openai.NotFoundError:
    pass
client.responses.delete(previous)
try:
    client.responses.retrieve(previous)
    check(False, "a deleted response is still there")
except openai.NotFoundError:
    pass
print("responses client: all checks passed")

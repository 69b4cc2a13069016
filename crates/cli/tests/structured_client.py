"""Structured output and tool calls with the official `openai` client against `modelmux serve`.

Run by crates/cli/tests/cli/llm.rs: python structured_client.py <base_url>. Every answer is checked
with the `jsonschema` package (an independent validator). The checks are `check(...)` calls,
not `assert` statements, so they run under `python -O` too.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
MODELS = ["smollm2", "smollm2:pirate", "smollm2:poet"]


def check(condition, *context):
    """Raises AssertionError with `context` unless `condition` (never skipped, unlike assert)."""
    if not condition:
        raise AssertionError(*context) if context else AssertionError("check failed")


def schemas():
    """50 different schemas: objects, arrays, enums, nested required fields, bounded numbers."""
    colours = ["red", "green", "blue", "black", "white", "amber", "teal", "plum", "gold", "grey"]
    out = []
    for i in range(10):
        out.append({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8 + i},
                "age": {"type": "integer", "minimum": i, "maximum": 60 + 7 * i},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        })
        out.append({
            "type": "object",
            "properties": {"colour": {"enum": colours[: 3 + i % 7]}, "count": {"type": "integer", "minimum": 1, "maximum": 3 + i}},
            "required": ["colour", "count"],
            "additionalProperties": False,
        })
        out.append({
            "type": "array",
            "items": {"type": "integer", "minimum": -i - 1, "maximum": 10 * (i + 1)},
            "minItems": 1,
            "maxItems": 2 + i % 3,
        })
        out.append({
            "type": "object",
            "properties": {
                "person": {
                    "type": "object",
                    "properties": {
                        "first": {"type": "string", "maxLength": 10},
                        "last": {"type": "string", "maxLength": 10 + i},
                    },
                    "required": ["first", "last"],
                    "additionalProperties": False,
                },
                "score": {"type": "number", "minimum": 0, "maximum": i + 1},
            },
            "required": ["person", "score"],
            "additionalProperties": False,
        })
        out.append({
            "type": "object",
            "properties": {
                "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"enum": ["a", "b", "c", f"t{i}"]}, "maxItems": 1 + i % 4},
                "level": {"enum": [1, 2, 3, None]},
            },
            "required": ["ok", "tags", "level"],
            "additionalProperties": False,
        })
    return out


def constrained(i, schema):
    model = MODELS[i % len(MODELS)]
    if i % 5 == 3:
        # Fractional numbers on the base model: the test adapters are random weights, and
        # greedy noise can write "1.000..." until max_tokens (JSON bounds a number's value,
        # not its digits), which says nothing about enforcement.
        model = "smollm2"
    fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
    kw = dict(model=model, max_tokens=300, temperature=0, response_format=fmt)
    question = f"Invent record number {i} for a database. Answer in JSON."
    if i % 5 == 4:
        # The completions endpoint takes response_format too (the client has no argument for
        # it there: vLLM's extension, sent in the body).
        kw["extra_body"] = {"response_format": kw.pop("response_format")}
        r = client.completions.create(prompt=question + "\n", **kw)
        return model, r.choices[0].text, r.choices[0].finish_reason
    messages = [{"role": "user", "content": question}]
    if i % 2 == 0:
        r = client.chat.completions.create(messages=messages, **kw)
        return model, r.choices[0].message.content, r.choices[0].finish_reason
    text, reason = "", None
    for chunk in client.chat.completions.create(messages=messages, stream=True, **kw):
        for c in chunk.choices:
            text += c.delta.content or ""
            reason = c.finish_reason or reason
    return model, text, reason


# 1. Fifty schemas, on the base model and two adapters, streamed and not, eight at a time.
all_schemas = schemas()
check(len({json.dumps(s, sort_keys=True) for s in all_schemas}) == 50)
with ThreadPoolExecutor(8) as pool:
    results = list(pool.map(constrained, range(50), all_schemas))
for i, ((model, text, reason), schema) in enumerate(zip(results, all_schemas)):
    check(reason == "stop", (i, model, reason, text))
    try:
        value = json.loads(text)
    except ValueError as e:
        raise AssertionError((i, model, text, e))
    jsonschema.validate(value, schema)

# json_object: an object, whatever the prompt asks. (A question with a short answer: on a
# joke, greedy decoding of this 135M model with the test adapter can loop ("aye, aye, ...")
# until max_tokens, which says nothing about the constraint.)
r = client.chat.completions.create(
    model="smollm2:pirate", max_tokens=200, temperature=0,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    response_format={"type": "json_object"},
)
check(r.choices[0].finish_reason == "stop", r)
check(isinstance(json.loads(r.choices[0].message.content), dict), r)

# 2. A schema that cannot be compiled is a 400, never free text.
for bad in [{"type": "no-such-type"}, {"$ref": "#/$defs/missing"}]:
    try:
        client.chat.completions.create(
            model="smollm2", max_tokens=10, messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": bad}},
        )
        raise AssertionError(f"{bad} was accepted")
    except openai.BadRequestError as e:
        check("response_format" in str(e), str(e))

# 3. Eight streams, four constrained: the free four answer as they do alone.
free_questions = ["What is the capital of France?", "Name three colours.", "Write a haiku about rain.", "How do birds fly?"]


def free(question):
    text = ""
    for chunk in client.chat.completions.create(
        model="smollm2", max_tokens=24, temperature=0, stream=True,
        messages=[{"role": "user", "content": question}],
    ):
        for c in chunk.choices:
            text += c.delta.content or ""
    return text


alone = [free(q) for q in free_questions]
with ThreadPoolExecutor(8) as pool:
    frees = [pool.submit(free, q) for q in free_questions]
    bound = [pool.submit(constrained, 2 * k + 1, all_schemas[k]) for k in range(4)]
    together = [f.result() for f in frees]
    for k, f in enumerate(bound):
        jsonschema.validate(json.loads(f.result()[1]), all_schemas[k])
check(together == alone, (together, alone))

# 4. Tools.
weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
clock = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"utc_offset": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["utc_offset"],
            "additionalProperties": False,
        },
    },
}
tools = [weather, clock]
schemas_by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
question = [{"role": "user", "content": "What is the weather in Paris, and what time is it there?"}]


def calls_of(message):
    check(message.tool_calls, message)
    out = []
    for call in message.tool_calls:
        check(call.type == "function" and call.id, call)
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, schemas_by_name[call.function.name])
        out.append((call.function.name, args))
    return out


for model in MODELS:
    for choice in ["required", {"type": "function", "function": {"name": "get_time"}}]:
        # The test adapters are random weights: greedy noise repeats a call until the limit
        # of parallel calls, so they make one call each (the base model may make several).
        r = client.chat.completions.create(
            model=model, max_tokens=400, temperature=0, messages=question, tools=tools, tool_choice=choice,
            parallel_tool_calls=model == "smollm2",
        )
        check(r.choices[0].finish_reason == "tool_calls", r)
        calls = calls_of(r.choices[0].message)
        if isinstance(choice, dict):
            check([name for name, _ in calls] == ["get_time"], calls)

# Streamed deltas add up to the non-streamed call.
kw = dict(model="smollm2:poet", max_tokens=400, temperature=0, messages=question, tools=tools, tool_choice="required", parallel_tool_calls=False)
whole = client.chat.completions.create(**kw)
streamed, reasons = {}, []
for chunk in client.chat.completions.create(stream=True, **kw):
    for c in chunk.choices:
        reasons.append(c.finish_reason)
        for d in c.delta.tool_calls or []:
            entry = streamed.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += d.id or ""
            entry["name"] += (d.function and d.function.name) or ""
            entry["arguments"] += (d.function and d.function.arguments) or ""
expected = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in whole.choices[0].message.tool_calls]
got = [streamed[i] for i in sorted(streamed)]
check([(g["name"], g["arguments"]) for g in got] == [(e["name"], e["arguments"]) for e in expected], (got, expected))
check([r for r in reasons if r] == ["tool_calls"], reasons)

# A second turn with the tool's answer: the answer reaches the prompt. Its prompt is longer
# than the same history without it, by more the longer the tool's answer is (a template path
# that dropped tool messages would count the same tokens for all three).
first = whole.choices[0].message
history = question + [first.model_dump(exclude_none=True)]


def second_turn(result):
    """The second turn's answer, with `result` as every call's tool message (None: none)."""
    turn = list(history)
    for call in first.tool_calls if result is not None else []:
        turn.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"result": result})})
    return client.chat.completions.create(model="smollm2", max_tokens=40, temperature=0, messages=turn, tools=tools)


without, short, long = (second_turn(None), second_turn("sunny"), second_turn("sunny, 21 degrees " * 20))
lengths = [r.usage.prompt_tokens for r in (without, short, long)]
check(lengths[0] < lengths[1] and lengths[1] + 40 <= lengths[2], "the tool's answer is not in the prompt", lengths)
check(short.choices[0].message.content or short.choices[0].message.tool_calls, short)

# tool_choice "none": no calls, and the tools do not reach the prompt: the answer is, token for
# token, the one without tools (under "auto" this model answers this question otherwise).
r = client.chat.completions.create(model="smollm2", max_tokens=20, temperature=0, messages=question, tools=tools, tool_choice="none")
plain = client.chat.completions.create(model="smollm2", max_tokens=20, temperature=0, messages=question)
auto = client.chat.completions.create(model="smollm2", max_tokens=20, temperature=0, messages=question, tools=tools, tool_choice="auto")
check(not r.choices[0].message.tool_calls and r.choices[0].message.content, r)
check(r.choices[0].message.content == plain.choices[0].message.content, r, plain)
check(r.usage.prompt_tokens == plain.usage.prompt_tokens < auto.usage.prompt_tokens, r.usage, plain.usage, auto.usage)
print("structured output and tools: every check passed")

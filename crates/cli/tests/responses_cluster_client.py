"""The official `openai` client continues, through one node of a cluster, a conversation that
another node stored.

Run by crates/cli/tests/cli/llm.rs: python responses_cluster_client.py n1=<url> n2=<url>. Turn 1
is stored by whichever node's ingress replica served it (its id names that node, the owner);
turn 2 is sent through the other node, again and again, until that node's own ingress has
handled one (its front may route a request to either node's ingress, and the requests counter by
API of that node's `/metrics` says when it did: the turn reached the owner through forwarding).
Every turn 2 must be the chat of [turn 1, its answer, turn 2] (greedy), stored by the owner.
Prints the owner's node id and turn 1's id, for the test to stop the owner and see the 404.
"""

import json
import sys
import urllib.request

import openai

nodes = dict(arg.split("=", 1) for arg in sys.argv[1:])
clients = {
    node: openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    for node, url in nodes.items()
}
MODEL = "smollm2:pirate"
N = 20


def check(condition, *context):
    """Raises AssertionError with `context` unless `condition` (never skipped, unlike assert)."""
    if not condition:
        raise AssertionError(*context) if context else AssertionError("check failed")


def node_of(response_id):
    """The node a response id names: `resp_<node in hex>.<random>`."""
    named = response_id.removeprefix("resp_")
    check("." in named, response_id)
    return bytes.fromhex(named.split(".", 1)[0]).decode()


def responses_answered(node):
    """`modelmux_api_requests_total{api="responses",status="2xx"}` on `node`'s own ingress."""
    with urllib.request.urlopen(nodes[node] + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (line.startswith("modelmux_api_requests_total{")
                and 'api="responses"' in line and 'status="2xx"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


first_node = sorted(nodes)[0]
turn1 = "My name is Ada and I live in Lisbon."
turn2 = "Repeat my name and my city."
stored = clients[first_node].responses.create(
    model=MODEL, input=turn1, max_output_tokens=N, temperature=0
)
owner = node_of(stored.id)
check(owner in nodes, stored.id, nodes)
other = next(node for node in nodes if node != owner)

conversation = [
    {"role": "user", "content": turn1},
    {"role": "assistant", "content": stored.output_text},
    {"role": "user", "content": turn2},
]
expected = clients[owner].chat.completions.create(
    model=MODEL, messages=conversation, max_tokens=N, temperature=0
)

before = responses_answered(other)
forwarded = False
for attempt in range(40):
    response = clients[other].responses.create(
        model=MODEL,
        input=turn2,
        previous_response_id=stored.id,
        max_output_tokens=N,
        temperature=0,
    )
    check(response.previous_response_id == stored.id, response)
    check(node_of(response.id) == owner, "a branch not stored by the owner", response.id, owner)
    check(response.output_text == (expected.choices[0].message.content or ""),
          (response.output_text, expected.choices[0].message.content))
    check(response.usage.input_tokens == expected.usage.prompt_tokens, response.usage)
    check(response.usage.output_tokens == expected.usage.completion_tokens, response.usage)
    # The branch is stored where its conversation is, and retrievable through either node.
    for node in nodes:
        check(clients[node].responses.retrieve(response.id).output_text == response.output_text)
    if responses_answered(other) > before:
        forwarded = True
        break
check(forwarded, f"node {other}'s ingress never handled a turn in 40 tries")
print(json.dumps({"owner": owner, "stored": stored.id}))

#!/usr/bin/env python3
"""Renders a chat template with the `jinja2` package the way Hugging Face transformers'
`apply_chat_template` does (transformers/utils/chat_template_utils.py): the reference the
LLM tests (crates/llm/tests/llm/templates.rs) compare modelmux's minijinja rendering with.

Reads a JSON list of renderings on stdin, each
  {"template": str, "messages": [...], "tools": [...] | null, "add_generation_prompt": bool,
   "bos_token": str, "eos_token": str, "kwargs": {...}}
and writes a JSON list on stdout, one answer per rendering in order: {"text": str}, or
{"error": str, "type": str} when the template raises (`raise_exception`) or otherwise fails
to render. (One process for many renderings: starting Python and importing jinja2 cost more
than a rendering.)
"""

import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides jinja2's tojson (which escapes HTML characters and sorts keys)
    # with a plain json.dumps.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format):
    return datetime.now().strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(request):
    try:
        template = environment().from_string(request["template"])
        # As apply_chat_template: `tools` and `documents` are passed (as None when absent),
        # the special tokens and any extra keyword arguments become variables.
        text = template.render(
            messages=request["messages"],
            tools=request.get("tools"),
            documents=None,
            add_generation_prompt=request.get("add_generation_prompt", False),
            bos_token=request.get("bos_token", ""),
            eos_token=request.get("eos_token", ""),
            **request.get("kwargs", {}),
        )
    except Exception as e:  # noqa: BLE001 - the error is the answer
        return {"error": str(e), "type": type(e).__name__}
    return {"text": text}


def main():
    json.dump([render(r) for r in json.load(sys.stdin)], sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()

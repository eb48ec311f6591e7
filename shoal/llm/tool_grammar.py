"""The llama.cpp grammar that makes a model call a tool (OpenAI's `tool_choice` "required" or a
named function): its output can only be one or more calls in the form the prompt shows,
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (shared/config/tool_prompt.py),
each naming one of the functions with arguments that follow that function's JSON schema.

With `tool_choice` "auto" the same calls are the rest of the answer once the model has started
one: a lazy grammar (`LazyGrammar`) that joins the sampler when the text ends with the call's
opening, so free text stays free and a started call always parses and validates.

The call's JSON comes from llama-cpp-python's schema converter, as `response_format` does, over a
schema with one alternative per function (its name a constant, its parameters the arguments'
schema), name first so that a stream can show the name before the arguments.
"""

from __future__ import annotations

import json
import re
from typing import Any

from shared.config.tool_prompt import CALL_CLOSE, CALL_OPEN
from shoal.llm.llama_c_api import LazyGrammar
from shoal.llm.response_grammar import json_schema_grammar

_ROOT = re.compile(r"^root ::=", re.MULTILINE)
OPENING = CALL_OPEN + "\n"  # a call's start, as the prompt shows it


def call_schema(tools: list[dict[str, Any]], choice: Any) -> dict[str, Any]:
    """The JSON schema of one call: to any of `tools` ("required"), or to the one named."""
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    alternatives = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool["function"]["name"]},
                "arguments": tool["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for tool in tools
        if named is None or tool["function"]["name"] == named
    ]
    if not alternatives:
        raise ValueError(f"tool_choice names '{named}', which is not among the tools")
    return alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}


def _rules(tools: list[dict[str, Any]], choice: Any) -> str:
    """The rules of one call (`tool-call`) and of its JSON (`tool-call-json`), without a root."""
    call = _ROOT.sub("tool-call-json ::=", json_schema_grammar(call_schema(tools, choice), ["name", "arguments"]))
    return f"tool-call ::= {json.dumps(OPENING)} tool-call-json {json.dumps(chr(10) + CALL_CLOSE)}\n{call}"


def tool_grammar(tools: list[dict[str, Any]], choice: Any, parallel: bool = True) -> str:
    """The GBNF (root rule `root`) for calls to `tools` as `choice` asks; `parallel` false: one."""
    root = 'root ::= tool-call ("\\n" tool-call)*' if parallel else "root ::= tool-call"
    return f"{root}\n{_rules(tools, choice)}"


def lazy_tool_grammar(tools: list[dict[str, Any]], parallel: bool = True) -> LazyGrammar:
    """`tool_choice` "auto": the grammar of what follows a started call, for each way the text may
    end when the call has started: `<tool_call` (the `>` is then forced too, so no token that
    carries more than `>` can slip by it), `<tool_call>`, `<tool_call>\\n`. The longest first."""
    rules, more = _rules(tools, "required"), ' ("\\n" tool-call)*' if parallel else ""
    close = json.dumps(chr(10) + CALL_CLOSE)
    openings = []
    for cut in range(len(OPENING), len(CALL_OPEN) - 2, -1):
        rest = f"{json.dumps(OPENING[cut:])} " if cut < len(OPENING) else ""
        openings.append((OPENING[:cut], f"root ::= {rest}tool-call-json {close}{more}\n{rules}"))
    return LazyGrammar(tuple(openings))

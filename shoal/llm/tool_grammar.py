"""The llama.cpp grammar that makes a model call a tool (OpenAI's `tool_choice` "required" or a
named function): its output can only be one or more calls in the form the prompt shows,
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (shared/config/tool_prompt.py),
each naming one of the functions with arguments that follow that function's JSON schema.

The call's JSON comes from llama-cpp-python's schema converter, as `response_format` does, over a
schema with one alternative per function (its name a constant, its parameters the arguments'
schema), name first so that a stream can show the name before the arguments.
"""

from __future__ import annotations

import json
import re
from typing import Any

from shared.config.tool_prompt import CALL_CLOSE, CALL_OPEN
from shoal.llm.response_grammar import json_schema_grammar

_ROOT = re.compile(r"^root ::=", re.MULTILINE)


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


def tool_grammar(tools: list[dict[str, Any]], choice: Any, parallel: bool = True) -> str:
    """The GBNF (root rule `root`) for calls to `tools` as `choice` asks; `parallel` false: one."""
    call = _ROOT.sub("tool-call-json ::=", json_schema_grammar(call_schema(tools, choice), ["name", "arguments"]))
    tag = f"{json.dumps(CALL_OPEN + chr(10))} tool-call-json {json.dumps(chr(10) + CALL_CLOSE)}"
    root = 'root ::= tool-call ("\\n" tool-call)*' if parallel else "root ::= tool-call"
    return f"{root}\ntool-call ::= {tag}\n{call}"

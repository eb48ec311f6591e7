"""OpenAI's tool calling in a chat request, checked: `tools`, `tool_choice`,
`parallel_tool_calls`, and the conversation's assistant calls and tool results
(docs/openai.md, "Tool calling"). Pure functions of the JSON body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.gateway.openai.openai_errors import invalid_value

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name


@dataclass(frozen=True)
class Tools:
    """The functions the model may call and how: `choice` is "auto", "required" or the name of
    the one function it must call."""

    tools: list[dict[str, Any]]  # OpenAI's tool objects, {"type": "function", "function": {...}}
    choice: str
    parallel: bool = True
    named: bool = False  # `choice` names a function

    def choice_document(self) -> Any:
        """`tool_choice` as OpenAI writes it, for the model's input."""
        return {"type": "function", "function": {"name": self.choice}} if self.named else self.choice


def parse_tools(doc: dict[str, Any]) -> Tools | None:
    """The request's tools, or None when it asks for none (no tools, or `tool_choice` "none")."""
    parallel = doc.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid_value("parallel_tool_calls", "expected a boolean")
    given, choice = doc.get("tools"), doc.get("tool_choice")
    if given is None or given == []:
        if choice not in (None, "none"):
            raise invalid_value("tool_choice", "only allowed when 'tools' are given")
        return None
    if not isinstance(given, list):
        raise invalid_value("tools", "expected a list of tools")
    tools = [_tool(tool, i) for i, tool in enumerate(given)]
    names = [tool["function"]["name"] for tool in tools]
    if len(set(names)) != len(names):
        raise invalid_value("tools", "two functions have the same name")
    if choice in (None, "auto", "required"):
        return Tools(tools, choice or "auto", parallel is not False)
    if choice == "none":
        return None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if name not in names:
        why = "expected 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': <a tool's name>}}"
        raise invalid_value("tool_choice", why)
    return Tools(tools, str(name), parallel is not False, named=True)


def _tool(tool: Any, index: int) -> dict[str, Any]:
    where = f"tools[{index}]"
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict):
        raise invalid_value(where, "expected {'type': 'function', 'function': {...}}")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid_value(where + ".function.name", "expected 1 to 64 letters, digits, '_' or '-'")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise invalid_value(where + ".function.parameters", "expected a JSON schema object")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_value(where + ".function.description", "expected a string")
    kept = {"name": name, "parameters": parameters} | ({"description": description} if description else {})
    return {"type": "function", "function": kept}


def tool_turn(message: dict[str, Any], where: str) -> dict[str, Any]:
    """The tool-calling fields of one message: an assistant's `tool_calls`, a tool result's
    `tool_call_id`."""
    if message["role"] == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid_value(where + ".tool_call_id", "a tool message needs the id of the call it answers")
        return {"tool_call_id": call_id}
    calls = message.get("tool_calls")
    if not calls:
        return {}
    if message["role"] != "assistant" or not isinstance(calls, list):
        raise invalid_value(where + ".tool_calls", "expected a list of calls in an assistant message")
    return {"tool_calls": [_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)]}


def _call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if (
        not isinstance(function, dict)
        or not isinstance(call.get("id"), str)
        or not isinstance(function.get("name"), str)
        or not isinstance(function.get("arguments"), str)
    ):
        raise invalid_value(where, "expected {'id', 'type': 'function', 'function': {'name', 'arguments'}}")
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": function["arguments"]},
    }

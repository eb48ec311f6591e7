"""Tools in a chat prompt: OpenAI's function definitions, the assistant's calls and the tools'
results, rendered for a chat template (docs/openai.md, "Tool calling").

A template that reads `tools` (Qwen 2.5, Hermes, Llama 3.1, ...) gets them as Hugging Face
tokenizers pass them: the `tools` variable, the assistant's calls as `tool_calls` with their
`arguments` an object. Any other template (SmolLM2's) gets the same in plain text, in the
Hermes/Qwen style most small instruction models have seen: the tools as JSON inside
`<tools></tools>` in a system message, a call as `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>` and a result as `<tool_response>...</tool_response>` in a user turn (a template
that knows no `tool` role would print an unknown role). Calls are parsed back from that same
form, whichever way the prompt was rendered.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": '
    "<args-json-object>}}\n</tool_call>"
)


@lru_cache(maxsize=64)  # parsed once per template, as `compiled` compiles it once
def reads_tools(template: str) -> bool:
    """Whether the Jinja template uses a `tools` variable (then it renders them itself)."""
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])  # as `compiled` has
    return "tools" in meta.find_undeclared_variables(environment.parse(template))


def system_text(tools: list[dict[str, Any]]) -> str:
    """The fallback system message: the tools' definitions and the form a call takes."""
    return _INSTRUCTIONS.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it (and as the grammar for a required call enforces it)."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{call}\n{CALL_CLOSE}"


def _arguments(call: dict[str, Any]) -> Any:
    """A call's arguments as an object: OpenAI sends them as a JSON string."""
    raw = call.get("function", {}).get("arguments", "{}")
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:  # the client's own text: kept as it is
        return raw


def for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as Hugging Face templates read it: calls' arguments as objects, no None
    content (templates concatenate it)."""
    shaped = []
    for message in messages:
        message = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": _arguments(call)}}
                for call in message["tool_calls"]
            ]
        shaped.append(message)
    return shaped


def as_text(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """The conversation in plain roles and text, for a template that does not read `tools`."""
    plain: list[dict[str, str]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if message.get("tool_calls"):
            calls = [call_text(c["function"]["name"], _arguments(c)) for c in message["tool_calls"]]
            content = "\n".join(([content] if content else []) + calls)
        if role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        if plain and role == "user" and message["role"] == "tool" and plain[-1]["content"].endswith("</tool_response>"):
            plain[-1]["content"] += "\n" + content  # the results of parallel calls: one turn
            continue
        plain.append({"role": role, "content": content})
    if tools:
        if plain and plain[0]["role"] in ("system", "developer"):
            plain[0] = {"role": plain[0]["role"], "content": plain[0]["content"] + "\n\n" + system_text(tools)}
        else:
            plain.insert(0, {"role": "system", "content": system_text(tools)})
    return plain

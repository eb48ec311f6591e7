"""Which parser reads a model's tool calls (docs/openai.md, "Tool calling"): Triton's OpenAI
front end's `--tool-call-parser` names, `llama3` and `mistral`, and `hermes` (the
`<tool_call>` blocks, the default). The model's config parameter `tool_call_parser` wins over
the gateway's flag, so one gateway serves models of several families.
"""

from __future__ import annotations

from collections.abc import Callable

from services.gateway.openai.json_tool_calls import Llama3Parser, MistralParser
from services.gateway.openai.openai_errors import OpenAIError, invalid_value
from services.gateway.openai.tool_calls import CallParser, ToolParser
from shared.config.model_config import ModelSpec

PARSERS: dict[str, Callable[[bool], ToolParser]] = {
    "hermes": CallParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
}
DEFAULT = "hermes"


def parser_name(spec: ModelSpec, default: str = DEFAULT) -> str:
    """The model's parser: its config's `tool_call_parser`, else the gateway's."""
    return spec.parameters.get("tool_call_parser") or default


def tool_parser(spec: ModelSpec, parallel: bool, default: str = DEFAULT, forced: bool = False) -> ToolParser:
    """A fresh parser for one answer; a name no parser has is the config's error (a 500).
    `forced`: `tool_choice` is "required" or names a function, which a model enforces with the
    grammar of `<tool_call>` blocks only (shoal/llm/tool_grammar.py): another parser would read
    those calls as content, so that is the client's 400."""
    name = parser_name(spec, default)
    make = PARSERS.get(name)
    if make is None:
        known = ", ".join(PARSERS)
        raise OpenAIError(f"model '{spec.name}': tool_call_parser '{name}' is not one of {known}", 500)
    if forced and name != "hermes":
        why = f"forcing a call ('required' or a named function) is supported with the hermes format only; model '{spec.name}' has tool_call_parser '{name}'"
        raise invalid_value("tool_choice", why)
    return make(parallel)

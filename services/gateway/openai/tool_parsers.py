"""Which parser reads a model's tool calls (docs/openai.md, "Tool calling"): Triton's OpenAI
front end's `--tool-call-parser` names, `llama3` and `mistral`, and `hermes` (the
`<tool_call>` blocks, the default). The model's config parameter `tool_call_parser` wins over
the gateway's flag, so one gateway serves models of several families.
"""

from __future__ import annotations

from collections.abc import Callable

from services.gateway.openai.json_tool_calls import Llama3Parser, MistralParser
from services.gateway.openai.openai_errors import OpenAIError
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


def tool_parser(spec: ModelSpec, parallel: bool, default: str = DEFAULT) -> ToolParser:
    """A fresh parser for one answer; a name no parser has is the config's error (a 500)."""
    name = parser_name(spec, default)
    make = PARSERS.get(name)
    if make is None:
        known = ", ".join(PARSERS)
        raise OpenAIError(f"model '{spec.name}': tool_call_parser '{name}' is not one of {known}", 500)
    return make(parallel)

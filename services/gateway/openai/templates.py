"""Chat templates applied by the front end, for generation models without a `messages` input.

The template is the model's Jinja chat template (the `chat_template` of its tokenizer), given
in its config as the parameter `chat_template`, with `bos_token` / `eos_token` parameters when
it uses them; it is rendered as Hugging Face tokenizers do (a sandbox, `add_generation_prompt`).
The config carries it rather than a file, because a gateway need not see the model repository.
"""

from __future__ import annotations

from typing import Any

from services.gateway.openai.openai_errors import OpenAIError
from shared.config.chat_template import render_chat as render
from shared.config.model_config import ModelSpec


def has_template(spec: ModelSpec) -> bool:
    return bool(spec.parameters.get("chat_template"))


def render_chat(spec: ModelSpec, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt for `messages` and the `tools` the model may call; a template that fails or
    refuses the conversation is a 400."""
    from jinja2 import TemplateError

    try:
        parameters = spec.parameters
        return render(
            parameters["chat_template"],
            messages,
            parameters.get("bos_token", ""),
            parameters.get("eos_token", ""),
            tools,
        )
    except TemplateError as exc:
        raise OpenAIError(f"model '{spec.name}' chat template: {exc}", 400, param="messages") from None

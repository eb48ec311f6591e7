"""Chat templates applied by the front end, for generation models without a `messages` input.

The template is the model's Jinja chat template (the `chat_template` of its tokenizer), given
in its config as the parameter `chat_template`, with `bos_token` / `eos_token` parameters when
it uses them; it is rendered as Hugging Face tokenizers do (a sandbox, `add_generation_prompt`).
The config carries it rather than a file, because a gateway need not see the model repository.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from services.gateway.openai.errors import OpenAIError
from shared.config.model_config import ModelSpec


def has_template(spec: ModelSpec) -> bool:
    return bool(spec.parameters.get("chat_template"))


@lru_cache(maxsize=64)
def _compiled(source: str) -> Any:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:  # what templates call to refuse a conversation
        raise TemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:  # Hugging Face's: no HTML escaping
        return json.dumps(value, ensure_ascii=False, indent=indent)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.globals["raise_exception"] = raise_exception
    environment.filters["tojson"] = tojson
    return environment.from_string(source)


def render_chat(spec: ModelSpec, messages: list[dict[str, str]]) -> str:
    """The prompt for `messages`; a template that fails or refuses the conversation is a 400."""
    from jinja2 import TemplateError

    try:
        return str(
            _compiled(spec.parameters["chat_template"]).render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=spec.parameters.get("bos_token", ""),
                eos_token=spec.parameters.get("eos_token", ""),
            )
        )
    except TemplateError as exc:
        raise OpenAIError(f"model '{spec.name}' chat template: {exc}", 400, param="messages") from None

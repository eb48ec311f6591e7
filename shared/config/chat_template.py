"""Chat templates as Hugging Face tokenizers render them: the model's Jinja template in a sandbox,
with `add_generation_prompt`, `raise_exception` and an unescaped `tojson`.

Both the OpenAI front end (a template given in a model's config) and `shoal.llm` (the template
inside a GGUF file) render with this.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from shared.config.tool_prompt import as_text, for_template, reads_tools


@lru_cache(maxsize=64)
def compiled(source: str) -> Any:
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


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt for a conversation, with the tools the model may call (None: no tools); a
    template that does not read `tools` gets them, and the calls and results, as text
    (`tool_prompt.py`). jinja2.TemplateError when the template fails or refuses it."""
    if reads_tools(template):
        variables: dict[str, Any] = {"messages": for_template(messages), "tools": tools or None}
    else:
        variables = {"messages": as_text(messages, tools)}
    rendered = compiled(template).render(
        **variables, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
    )
    return str(rendered)

"""Text in and out of a language model: chat templates and incremental detokenization."""

from __future__ import annotations

import codecs
import json
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=8)
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


def render_chat(template: str, messages: list[dict[str, Any]], bos_token: str = "", eos_token: str = "") -> str:
    """The prompt for a conversation, rendered as Hugging Face tokenizers render their chat
    template (a sandbox, `add_generation_prompt`). Raises jinja2.TemplateError when the template
    fails or refuses the conversation."""
    return str(
        _compiled(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
        )
    )


class Detokenizer:
    """Token bytes to text as they come: a character split over two tokens appears whole, with
    the second."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, piece: bytes) -> str:
        return str(self._decoder.decode(piece))

    def flush(self) -> str:
        return str(self._decoder.decode(b"", final=True))

"""A model's LoRA adapters as its config declares them (docs/openai.md, "LoRA adapters").

The `lora_adapters` parameter holds what Triton's OpenAI front end reads from a `multi_lora.json`
beside the model: a JSON object, adapter name -> adapter file. The model (shoal/llm/python_model.py)
loads the files; the OpenAI front end serves each adapter as a model of its own, named
`<model><separator><adapter>` as Triton's `--lora-separator` names them, the separator being the
`lora_separator` parameter (default `_lora_`). Both read the declaration here, so the names the
front end offers are the names the model knows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

ADAPTERS = "lora_adapters"
SEPARATOR = "lora_separator"
DEFAULT_SEPARATOR = "_lora_"


def lora_adapters(parameters: Mapping[str, str]) -> dict[str, str]:
    """Adapter name -> file, from the config's parameters ({} when none are declared); ValueError
    for a declaration that is not a JSON object of non-empty names and file strings."""
    text = parameters.get(ADAPTERS, "").strip()
    if not text:
        return {}
    try:
        declared = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the '{ADAPTERS}' parameter is not JSON: {exc}") from None
    if not isinstance(declared, dict) or not all(
        isinstance(name, str) and name and isinstance(path, str) and path for name, path in declared.items()
    ):
        raise ValueError(f"the '{ADAPTERS}' parameter must be a JSON object of adapter names to GGUF files")
    return dict(declared)


def served_names(model: str, parameters: Mapping[str, str]) -> dict[str, str]:
    """The model name each adapter is served as -> the adapter's name; {} when the declaration is
    missing or invalid (a model with an invalid one fails its load, saying why)."""
    try:
        adapters = lora_adapters(parameters)
    except ValueError:
        return {}
    separator = parameters.get(SEPARATOR) or DEFAULT_SEPARATOR
    return {f"{model}{separator}{name}": name for name in adapters}

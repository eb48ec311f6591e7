"""The llama.cpp grammars (GBNF) for OpenAI's `response_format`: JSON while decoding."""

from __future__ import annotations

import json
from typing import Any

_LOOSE_CHAR = r'char ::= [^"\\] '
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] '


def json_schema_grammar(schema: dict[str, Any], prop_order: list[str] | None = None) -> str:
    """The GBNF (root rule `root`) of JSON that follows `schema`, by llama-cpp-python's own
    converter (a schema it cannot convert is the client's error, a 400)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = json_schema_to_gbnf(json.dumps(schema), prop_order)
    # the converter lets a string hold raw control characters, which JSON forbids (3 of 200
    # sampled answers had a raw newline in a name): the string character of JSON_GBNF instead
    return str(grammar).replace(_LOOSE_CHAR, _JSON_CHAR)


def grammar_for(given: Any) -> str:
    """The GBNF for OpenAI's `response_format` (JSON), "" for text: `json_object` any JSON object,
    `json_schema` its schema."""
    if given is None:
        return ""
    from llama_cpp.llama_grammar import JSON_GBNF

    asked = json.loads(given)
    kind = asked.get("type", "text")
    if kind == "json_object":
        return JSON_GBNF
    if kind == "json_schema":
        return json_schema_grammar(asked["json_schema"]["schema"])
    return ""

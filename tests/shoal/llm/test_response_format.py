"""shoal/llm/python_model.py's `grammar_for`: OpenAI's response_format as the GBNF the sampler
enforces (needs llama-cpp-python, the llm extra, for its converter)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp", reason="needs the llm extra: pip install '.[llm]'")
pytestmark = pytest.mark.llm

from llama_cpp.llama_grammar import JSON_GBNF  # noqa: E402

from shoal.llm.response_grammar import grammar_for  # noqa: E402


def schema_format(schema: dict) -> str:
    return json.dumps({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_text_asks_for_no_grammar_and_json_object_for_any_object():
    assert grammar_for(None) == "" and grammar_for(json.dumps({"type": "text"})) == ""
    assert grammar_for(json.dumps({"type": "json_object"})) == JSON_GBNF


def test_a_schemas_strings_hold_no_raw_control_characters():
    grammar = grammar_for(schema_format({"type": "object", "properties": {"name": {"type": "string"}}}))
    (char,) = [line for line in grammar.splitlines() if line.startswith("char ::=")]
    assert char.startswith(r'char ::= [^"\\\x7F\x00-\x1F]'), char  # JSON forbids them unescaped
    assert 'name-kv ::= "\\"name\\""' in grammar

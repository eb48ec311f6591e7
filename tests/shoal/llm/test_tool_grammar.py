"""shoal/llm/tool_grammar.py: the grammar that forces a tool call (needs llama-cpp-python, the
llm extra, for its schema converter); the real model follows it in test_openai_llm.py."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="needs the llm extra: pip install '.[llm]'")
pytestmark = pytest.mark.llm

from shoal.llm.tool_grammar import call_schema, tool_grammar  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NOW = {"type": "function", "function": {"name": "now"}}


def rules(grammar: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in grammar.splitlines())


def test_required_is_any_of_the_functions_and_several_calls_in_parallel():
    grammar = rules(tool_grammar([WEATHER, NOW], "required"))
    assert grammar["root"] == 'tool-call ("\\n" tool-call)*'
    assert grammar["tool-call"] == '"<tool_call>\\n" tool-call-json "\\n</tool_call>"'
    assert grammar["tool-call-json"] == "alternative-0 | alternative-1"
    assert grammar["alternative-0-name"] == '"\\"get_weather\\""' and grammar["alternative-1-name"] == '"\\"now\\""'
    assert 'space ":" space string' in grammar["alternative-0-arguments-city-kv"]  # the schema's argument


def test_a_named_function_is_the_only_one_and_without_parallel_calls_one_call():
    grammar = rules(tool_grammar([WEATHER, NOW], {"type": "function", "function": {"name": "now"}}, False))
    assert grammar["root"] == "tool-call" and grammar["name"] == '"\\"now\\""'
    assert grammar["tool-call-json"].startswith('"{" space name-kv "," space arguments-kv')  # the name first


def test_strings_hold_no_raw_control_characters_and_an_unknown_name_fails():
    assert rules(tool_grammar([WEATHER], "required"))["char"].startswith(r'[^"\\\x7F\x00-\x1F]')
    with pytest.raises(ValueError, match="'other'"):
        call_schema([WEATHER], {"type": "function", "function": {"name": "other"}})


def test_auto_has_the_grammar_of_what_follows_each_way_a_call_may_have_started():
    from shoal.llm.tool_grammar import lazy_tool_grammar

    lazy = lazy_tool_grammar([WEATHER, NOW])
    assert [opening for opening, _ in lazy.openings] == ["<tool_call>\n", "<tool_call>", "<tool_call"]
    roots = [rules(grammar)["root"] for _, grammar in lazy.openings]
    assert roots == [
        'tool-call-json "\\n</tool_call>" ("\\n" tool-call)*',
        '"\\n" tool-call-json "\\n</tool_call>" ("\\n" tool-call)*',
        '">\\n" tool-call-json "\\n</tool_call>" ("\\n" tool-call)*',  # a token carrying more than `>` is ruled out
    ]
    assert all(rules(grammar)["tool-call-json"] == "alternative-0 | alternative-1" for _, grammar in lazy.openings)
    single = lazy_tool_grammar([WEATHER], parallel=False)
    assert rules(single.openings[1][1])["root"] == '"\\n" tool-call-json "\\n</tool_call>"'

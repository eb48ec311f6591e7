"""Tool calling at the front end: the request's tools checked, and calls read out of the text
(services/gateway/openai/tool_requests.py and tool_calls.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.openai import requests
from services.gateway.openai.openai_errors import OpenAIError
from services.gateway.openai.tool_calls import CallDelta, CallParser, whole_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "weather in Paris?"}], "tools": [WEATHER]}
TEXT = (
    'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "at": {"h": 12}}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}} \n</tool_call>\n'
)


def parse(pieces: list[str], parallel: bool = True) -> tuple[str, list[CallDelta]]:
    parser = CallParser(parallel)
    content, deltas = [], []
    for piece in pieces:
        text, more = parser.feed(piece)
        content.append(text)
        deltas += more
    text, more = parser.flush()
    return "".join(content) + text, deltas + more


def test_tool_choice_defaults_to_auto_and_none_asks_for_no_tools():
    assert requests.parse_chat(CHAT).tools.choice == "auto"
    assert requests.parse_chat({**CHAT, "tool_choice": "none"}).tools is None
    assert requests.parse_chat({**CHAT, "tools": [], "parallel_tool_calls": False}).tools is None
    named = requests.parse_chat({**CHAT, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named.tools.named and named.tools.choice_document() == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    assert not requests.parse_chat({**CHAT, "tool_choice": "required", "parallel_tool_calls": False}).tools.parallel


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tool_choice": "always"}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [{"role": "tool", "content": "20C"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}, "messages[0].tool_calls[0]"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_a_malformed_tool_request_is_a_400_naming_the_parameter(extra, param):
    with pytest.raises(OpenAIError) as refused:
        requests.parse_chat({**CHAT, **extra})
    assert (refused.value.status, refused.value.param) == (400, param)


def test_an_assistant_call_and_the_tool_result_are_kept_in_the_conversation():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *CHAT["messages"],
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "20C"},
    ]
    parsed = requests.parse_chat({**CHAT, "messages": messages}).messages
    assert parsed[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert parsed[2] == {"role": "tool", "content": "20C", "tool_call_id": "call_1"}


def test_calls_are_read_out_with_the_content_before_them():
    content, deltas = parse([TEXT])
    assert content == "Let me look."
    calls = whole_calls(deltas)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris", "at": {"h": 12}},
        {"city": "Lyon"},
    ]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2


@given(st.lists(st.integers(1, len(TEXT) - 1), max_size=12))
def test_any_split_of_the_text_gives_the_whole_answer(cuts):
    bounds = [0, *sorted(set(cuts)), len(TEXT)]
    content, deltas = parse([TEXT[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])
    whole_content, whole_deltas = parse([TEXT])
    assert content == whole_content
    strip = [{**c, "id": None} for c in whole_calls(deltas)]
    assert strip == [{**c, "id": None} for c in whole_calls(whole_deltas)]


def test_a_streamed_call_starts_with_its_id_and_name_then_argument_fragments():
    _, deltas = parse(list(TEXT))  # one character at a time
    first = [d for d in deltas if d.index == 0]
    assert first[0].document() == {
        "index": 0,
        "id": first[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert len(first) > 5 and all(d.id is None and d.document()["function"].keys() == {"arguments"} for d in first[1:])


def test_without_parallel_calls_only_the_first_is_kept():
    content, deltas = parse([TEXT], parallel=False)
    assert content == "Let me look." and len(whole_calls(deltas)) == 1


def test_text_that_is_not_a_call_stays_content():
    assert parse(["a <tool_call>not json</tool_call> b"]) == ("a <tool_call>not json</tool_call> b", [])
    assert parse(["no calls, a < sign and <tool_c"]) == ("no calls, a < sign and <tool_c", [])


def test_a_call_with_its_arguments_first_is_read_whole():
    content, deltas = parse(['<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>'])
    assert content == "" and whole_calls(deltas)[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_a_call_cut_short_keeps_what_was_written():
    content, deltas = parse(['<tool_call>\n{"name": "f", "arguments": {"x": 1'])
    assert content == "" and whole_calls(deltas)[0]["function"] == {"name": "f", "arguments": '{"x": 1'}
    assert parse(['<tool_call>\n{"na']) == ('<tool_call>\n{"na', [])


@given(
    st.tuples(
        st.text("abc_", max_size=4),
        st.sampled_from(["\\x", "\\q", "\\u00zz", "\\ "]) | st.characters(max_codepoint=0x1F),
    ).map("".join),
    st.lists(st.integers(0, 80), max_size=6),
)
def test_a_call_whose_name_is_not_a_json_string_is_content(name, cuts):
    """A bad escape or a raw control character in the name: the block is the model's text."""
    text = 'Hm.<tool_call>\n{"name": "%s", "arguments": {}}\n</tool_call>' % name
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    assert parse([text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]) == (text, [])


@given(st.lists(st.integers(0, 120), max_size=6))
def test_text_after_a_call_keeps_its_spacing_and_white_space_alone_is_dropped(cuts):
    call = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    for text, content in [
        (f"x{call}\n{call}\n", "x"),
        (f"x{call} and more", "x and more"),
        (f"{call}\n\nDone.", "\n\nDone."),
    ]:
        bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
        assert parse([text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])[0] == content

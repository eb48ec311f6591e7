"""Llama 3.1's and Mistral's JSON tool calls read out of a model's text, whole and in any pieces
(services/gateway/openai/json_tool_calls.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.openai.json_tool_calls import JsonCallParser, Llama3Parser, MistralParser
from services.gateway.openai.tool_calls import CallDelta, whole_calls

LLAMA = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "note": "a } and a \\" {"}}; '
    '{"name": "get_time", "arguments": {"zone": ["CET", {"dst": true}]}}'
)
MISTRAL = (
    'Checking.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"arguments": {"zone": "CET"}, "name": "get_time"}]'
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
CALLS = st.lists(
    st.tuples(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), st.dictionaries(st.text(max_size=6), JSON, max_size=3)),
    min_size=1,
    max_size=3,
)


def parse(kind: type[JsonCallParser], pieces: list[str], parallel: bool = True) -> tuple[str, list[CallDelta]]:
    parser = kind(parallel)
    content, deltas = [], []
    for piece in pieces:
        text, more = parser.feed(piece)
        content.append(text)
        deltas += more
    text, more = parser.flush()
    return "".join(content) + text, deltas + more


def read(kind: type[JsonCallParser], text: str) -> tuple[str, list[tuple[str, object]]]:
    content, deltas = parse(kind, [text])
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole_calls(deltas)]


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def test_llama3_calls_after_the_python_tag_separated_by_semicolons():
    content, calls = read(Llama3Parser, LLAMA)
    assert content == ""
    assert calls == [
        ("get_weather", {"city": "Paris", "note": 'a } and a " {'}),
        ("get_time", {"zone": ["CET", {"dst": True}]}),
    ]
    assert read(Llama3Parser, ' {"name": "f", "parameters": {}}\n\nDone.') == (
        "\n\nDone.",
        [("f", {})],
    )  # its own spacing


def test_mistral_calls_in_an_array_after_their_token_with_content_before():
    assert read(MistralParser, MISTRAL) == (
        "Checking.",
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})],
    )
    assert read(MistralParser, '[{"name": "f", "arguments": {"a": 1}}]') == ("", [("f", {"a": 1})])


@pytest.mark.parametrize("kind, text", [(Llama3Parser, LLAMA), (MistralParser, MISTRAL)])
def test_a_streamed_call_starts_with_its_id_and_name_then_argument_fragments(kind, text):
    _, deltas = parse(kind, list(text))  # one character at a time
    first = [d for d in deltas if d.index == 0]
    assert first[0].document() == {
        "index": 0,
        "id": first[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert len(first) > 5 and all(d.id is None and d.document()["function"].keys() == {"arguments"} for d in first[1:])
    assert [d.index for d in deltas if d.id is not None] == [0, 1]


@given(st.sampled_from([(Llama3Parser, LLAMA), (MistralParser, MISTRAL)]), st.lists(st.integers(0, 400), max_size=12))
def test_any_split_of_the_text_gives_the_whole_answer(case, cuts):
    kind, text = case
    content, deltas = parse(kind, pieces(text, cuts))
    whole_content, whole_deltas = parse(kind, [text])
    assert content == whole_content
    assert [{**c, "id": None} for c in whole_calls(deltas)] == [{**c, "id": None} for c in whole_calls(whole_deltas)]


@given(CALLS, st.booleans(), st.lists(st.integers(0, 2000), max_size=8))
def test_llama3_calls_of_any_names_and_arguments_come_back(calls, tagged, cuts):
    text = ("<|python_tag|>" if tagged else "") + "; ".join(
        json.dumps({"name": name, "parameters": arguments}) for name, arguments in calls
    )
    content, deltas = parse(Llama3Parser, pieces(text, cuts))
    found = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in whole_calls(deltas)]
    assert (content, found) == ("", calls)


@given(CALLS, st.text(max_size=20).filter(lambda t: "[TOOL_CALLS]" not in t and not t.lstrip().startswith("[")))
def test_mistral_calls_of_any_names_and_arguments_come_back(calls, before):
    array = json.dumps([{"name": name, "arguments": arguments} for name, arguments in calls])
    content, found = read(MistralParser, before + "[TOOL_CALLS]" + array)
    assert (content, found) == (before, calls)


@given(st.text(max_size=40))
def test_text_without_a_call_is_content_as_written(text):
    if not text.lstrip().startswith(("{", "<|python_tag|>")):
        assert parse(Llama3Parser, [text]) == (text, [])
    if "[TOOL_CALLS]" not in text and not text.lstrip().startswith("["):
        assert parse(MistralParser, [text]) == (text, [])


@pytest.mark.parametrize(
    "kind, text",
    [
        (Llama3Parser, '{"answer": 42} is the JSON'),
        (Llama3Parser, '{"name": "f", "value": 1}'),
        (Llama3Parser, "<|python_tag|>print(1)"),
        (Llama3Parser, '{"name": "f", "para'),
        (MistralParser, "[1, 2, 3]"),
        (MistralParser, "a [TOOL_CALLS] not json"),
        (MistralParser, '[{"name": "f"}]'),
        (MistralParser, "the list [TOOL_"),
    ],
)
def test_text_that_is_not_a_call_stays_content(kind, text):
    assert parse(kind, [text]) == (text, [])


def test_without_parallel_calls_only_the_first_is_kept():
    for kind, text in [(Llama3Parser, LLAMA), (MistralParser, MISTRAL)]:
        content, deltas = parse(kind, [text], parallel=False)
        assert [c["function"]["name"] for c in whole_calls(deltas)] == ["get_weather"]


def test_a_call_cut_short_keeps_what_was_written():
    content, deltas = parse(Llama3Parser, ['{"name": "f", "parameters": {"x": [1'])
    assert content == "" and whole_calls(deltas)[0]["function"] == {"name": "f", "arguments": '{"x": [1'}


def test_mistral_ids_are_nine_letters_or_digits_as_its_template_wants():
    _, deltas = parse(MistralParser, [MISTRAL])
    ids = [d.id for d in deltas if d.id is not None]
    assert len(ids) == 2 and all(len(i) == 9 and i.isalnum() for i in ids) and ids[0] != ids[1]


# a name that is no JSON string: a bad escape or a raw control character
BAD_NAMES = st.tuples(
    st.text("abc_", max_size=4), st.sampled_from(["\\x", "\\q", "\\u00zz", "\\ "]) | st.characters(max_codepoint=0x1F)
).map("".join)


@given(
    BAD_NAMES,
    st.sampled_from(
        [
            (Llama3Parser, '{"name": "%s", "parameters": {}}'),
            (MistralParser, '[TOOL_CALLS][{"name": "%s", "arguments": {}}]'),
        ]
    ),
    st.lists(st.integers(0, 80), max_size=6),
)
def test_a_call_whose_name_is_not_a_json_string_is_content(name, case, cuts):
    kind, form = case
    text = form % name
    assert parse(kind, pieces(text, cuts)) == (text, [])


@given(st.lists(st.integers(0, 120), max_size=6))
def test_text_after_the_calls_keeps_its_spacing_and_a_lone_trailing_separator_is_dropped(cuts):
    mistral = 'Sure.[TOOL_CALLS][{"name": "a", "arguments": {}}] after'
    assert parse(MistralParser, pieces(mistral, cuts))[0] == "Sure. after"
    for tail in ("", " ", ";", "; \n", " ;"):
        assert parse(Llama3Parser, pieces('{"name": "a", "parameters": {}}' + tail, cuts))[0] == ""
    assert parse(Llama3Parser, pieces('{"name": "a", "parameters": {}}\n\nDone.', cuts))[0] == "\n\nDone."

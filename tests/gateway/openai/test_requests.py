from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.openai import requests
from services.gateway.openai.openai_errors import OpenAIError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_chat_reads_sampling_stop_and_usage_option():
    parsed = requests.parse_chat(
        {
            **CHAT,
            "max_completion_tokens": 5,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 7,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "user": "someone",
        }
    )
    assert parsed.sampling == {"max_tokens": 5, "temperature": 0.0, "top_p": 0.5, "seed": 7}
    assert (parsed.stop, parsed.stream, parsed.include_usage) == (["x"], True, True)
    assert parsed.messages == [{"role": "user", "content": "hi"}]


def test_text_content_parts_are_joined():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert requests.parse_chat({**CHAT, "messages": [{"role": "user", "content": parts}]}).messages == [
        {"role": "user", "content": "ab"}
    ]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"logit_bias": {"x": 2}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"logprobs": 1}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs true
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "high"}, "frequency_penalty"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(extra, param):
    with pytest.raises(OpenAIError) as refused:
        requests.parse_chat({**CHAT, **extra})
    assert (refused.value.status, refused.value.param) == (400, param)


def test_penalties_travel_as_sampling_and_a_zero_penalty_asks_nothing():
    asked = requests.parse_chat({**CHAT, "frequency_penalty": 1.5, "presence_penalty": -0.5})
    assert (asked.sampling["frequency_penalty"], asked.sampling["presence_penalty"]) == (1.5, -0.5)
    plain = requests.parse_completion({"model": "m", "prompt": "p", "frequency_penalty": 0, "presence_penalty": 0.0})
    assert plain.sampling == {}  # no input needed for it: a model without penalties serves it


def test_chat_logprobs_ask_for_a_count_of_likeliest_tokens():
    assert requests.parse_chat({**CHAT, "logprobs": True, "top_logprobs": 20}).logprobs == 20
    assert requests.parse_chat({**CHAT, "logprobs": True}).logprobs == 0  # the sampled token's only
    assert requests.parse_chat({**CHAT, "logprobs": False, "top_logprobs": 0}).logprobs is None
    assert requests.parse_chat(CHAT).logprobs is None


@pytest.mark.parametrize("value, asked", [(None, None), (0, 0), (5, 5)])
def test_completion_logprobs_is_a_count_up_to_5(value, asked):
    assert requests.parse_completion({"model": "m", "prompt": "p", "logprobs": value}).logprobs == asked


@pytest.mark.parametrize("extra", [{"logprobs": 6}, {"logprobs": True}])
def test_completion_logprobs_out_of_bounds_is_a_400(extra):
    with pytest.raises(OpenAIError) as refused:
        requests.parse_completion({"model": "m", "prompt": "p", **extra})
    assert (refused.value.status, refused.value.param) == (400, "logprobs")


def test_echo_with_logprobs_asks_for_the_prompts_and_max_tokens_0_scores_it_alone():
    asked = requests.parse_completion({"model": "m", "prompt": "p", "echo": True, "logprobs": 1, "max_tokens": 0})
    assert asked.echo and asked.logprobs == 1 and asked.sampling["max_tokens"] == 0
    for body in ({"max_tokens": 0}, {"max_tokens": 0, "echo": False}, {"max_tokens": False, "echo": True}):
        with pytest.raises(OpenAIError) as refused:  # without echo, nothing would come back
            requests.parse_completion({"model": "m", "prompt": "p", **body})
        assert refused.value.param == "max_tokens"


def test_logit_bias_maps_token_ids_to_biases():
    assert requests.parse_chat({**CHAT, "logit_bias": {"50256": -100, "7": 2.5}}).logit_bias == {50256: -100.0, 7: 2.5}
    assert requests.parse_completion({"model": "m", "prompt": "p", "logit_bias": {}}).logit_bias == {}


def test_n_choices_each_their_own_seed():
    asked = requests.parse_chat({**CHAT, "n": 3, "seed": 7})
    assert asked.n == 3 and requests.parse_chat(CHAT).n == 1
    assert [requests.choice_with_seed(asked, i).sampling["seed"] for i in range(3)] == [7, 8, 9]
    assert asked.sampling["seed"] == 7  # the request itself unchanged


def test_response_format_is_text_or_json():
    assert requests.parse_chat({**CHAT, "response_format": {"type": "text"}}).response_format is None
    assert requests.parse_chat({**CHAT, "response_format": {"type": "json_object"}}).response_format == {
        "type": "json_object"
    }
    schema = {"name": "point", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}
    asked = requests.parse_chat({**CHAT, "response_format": {"type": "json_schema", "json_schema": schema}})
    assert asked.response_format == {"type": "json_schema", "json_schema": schema}


def test_echo_is_a_completions_boolean():
    assert requests.parse_completion({"model": "m", "prompt": "p", "echo": True}).echo
    assert not requests.parse_completion({"model": "m", "prompt": "p"}).echo
    with pytest.raises(OpenAIError) as refused:
        requests.parse_completion({"model": "m", "prompt": "p", "echo": "yes"})
    assert refused.value.param == "echo"
    with pytest.raises(OpenAIError):  # chat has no echo
        requests.parse_chat({**CHAT, "echo": True})


def test_values_meaning_not_asked_for_are_accepted():
    requests.parse_chat({**CHAT, "logit_bias": {}, "logprobs": False, "tools": [], "presence_penalty": 0})
    requests.parse_completion({"model": "m", "prompt": ["one"], "echo": False, "best_of": 1})


def test_completion_takes_one_prompt():
    assert requests.parse_completion({"model": "m", "prompt": "p"}).prompt == "p"
    with pytest.raises(OpenAIError):
        requests.parse_completion({"model": "m", "prompt": ["a", "b"]})
    with pytest.raises(OpenAIError):
        requests.parse_completion({"model": "m", "prompt": [1, 2, 3]})


def test_embedding_input_and_format():
    parsed = requests.parse_embedding({"model": "e", "input": "x", "encoding_format": "base64"})
    assert (parsed.texts, parsed.base64) == (["x"], True)
    assert requests.parse_embedding({"model": "e", "input": ["a", "b"]}).base64 is False
    for bad in (
        {"input": []},
        {"input": [[1, 2]]},
        {"input": "x", "encoding_format": "int8"},
        {"input": "x", "dimensions": 8},
    ):
        with pytest.raises(OpenAIError):
            requests.parse_embedding({"model": "e", **bad})


@given(
    st.dictionaries(st.text(max_size=12), st.none() | st.booleans() | st.integers() | st.text(max_size=5), max_size=4)
)
def test_any_body_is_parsed_or_refused_with_a_400(extra):
    try:
        requests.parse_chat({**CHAT, **extra})
    except OpenAIError as exc:
        assert exc.status == 400 and exc.message

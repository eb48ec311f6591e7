"""Tool calls in Llama 3.1's and Mistral's forms through the official `openai` client against
the real services: the gateway started with `--tool-call-parser mistral`, one model whose config
says `tool_call_parser: llama3` (the config wins). The echo model says back the call its message
holds, word by word, so a stream splits it wherever the words split
(tests/integration/openai_models.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from shared.process.natsserver import free_port
from tests.cluster import Running, running_cluster
from tests.integration.openai_models import write_tool_parser_models

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
MISTRAL = 'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}]'
LLAMA3 = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "get_time", "parameters": {"zone": "CET"}}'
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = write_tool_parser_models(tmp_path_factory.mktemp("openai_tool_parsers"))
    with running_cluster(
        root, openai_address="127.0.0.1", openai_port=free_port(), tool_call_parser="mistral"
    ) as running:
        yield running


@pytest.fixture
def client(served: Running) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{served.cluster.gateway.openai_port}/v1", api_key="-") as c:
        yield c


def ask(model: str, text: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "tools": [WEATHER, TIME]}


def streamed(client: openai.OpenAI, asked: dict) -> tuple[str, list, str | None]:
    chunks = list(client.chat.completions.create(**asked, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    return content, deltas, chunks[-1].choices[0].finish_reason


def test_the_gateways_flag_reads_mistral_calls_whole_and_streamed(client: openai.OpenAI):
    whole = client.chat.completions.create(**ask("echo", MISTRAL)).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("tool_calls", "Checking. ")
    (call,) = whole.message.tool_calls
    assert len(call.id) == 9 and call.id.isalnum() and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": [1, 2]}
    content, deltas, reason = streamed(client, ask("echo", MISTRAL))
    assert (content, reason) == ("Checking. ", "tool_calls")
    assert deltas[0].function.name == "get_weather" and deltas[0].function.arguments == "" and len(deltas) > 2
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments for d in deltas) == call.function.arguments


def test_the_models_config_wins_and_reads_llama3_calls(client: openai.OpenAI):
    whole = client.chat.completions.create(**ask("echo-llama3", LLAMA3)).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("tool_calls", None)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert calls == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    content, deltas, reason = streamed(client, ask("echo-llama3", LLAMA3))
    assert (content, reason) == ("", "tool_calls")
    firsts = [d for d in deltas if d.id is not None]
    assert [(d.index, d.function.name) for d in firsts] == [(0, "get_weather"), (1, "get_time")]
    for index, (_, arguments) in enumerate(calls):
        assert json.loads("".join(d.function.arguments for d in deltas if d.index == index)) == arguments


@pytest.mark.parametrize(
    "model, text",
    [
        ("echo-llama3", '{"answer": 42} is not a call'),
        ("echo-llama3", 'Sure: {"name": "get_weather", "parameters": {"city": "Paris"}}'),  # not the answer's start
        ("echo", '<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>'),  # Hermes'
    ],
)
def test_text_that_is_not_a_call_in_the_models_form_is_content(client: openai.OpenAI, model: str, text: str):
    answer = client.chat.completions.create(**ask(model, text)).choices[0]
    assert (answer.message.content, answer.message.tool_calls, answer.finish_reason) == (text, None, "stop")
    content, deltas, reason = streamed(client, ask(model, text))
    assert (content, deltas, reason) == (text, [], "stop")


@pytest.mark.parametrize("model", ["echo", "echo-llama3"])  # the gateway's mistral, the config's llama3
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forcing_a_call_without_the_hermes_format_is_a_400_naming_the_parser(client: openai.OpenAI, model, choice):
    """The model forces a call by the grammar of `<tool_call>` blocks, which these parsers do not read."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="hermes format only") as raised:
            client.chat.completions.create(**ask(model, "hi"), tool_choice=choice, stream=stream)
        assert raised.value.status_code == 400 and raised.value.body["param"] == "tool_choice"


@pytest.mark.parametrize(
    "model, text",
    [
        ("echo", '[TOOL_CALLS][{"name": "a\\x", "arguments": {}}]'),
        ("echo-llama3", '{"name": "a\\x", "parameters": {}}'),
    ],
)
def test_a_call_whose_name_is_not_a_json_string_is_content(client: openai.OpenAI, model: str, text: str):
    answer = client.chat.completions.create(**ask(model, text)).choices[0]
    assert (answer.message.content, answer.message.tool_calls, answer.finish_reason) == (text, None, "stop")
    content, deltas, reason = streamed(client, ask(model, text))  # the stream ends as ever
    assert (content, deltas, reason) == (text, [], "stop")

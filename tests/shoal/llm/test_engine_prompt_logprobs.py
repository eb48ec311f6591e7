"""The prompt's log probabilities (OpenAI's `echo` with `logprobs`) on the fake model: each prompt
token scored from the logits of the position before it, the prompt decoded in full (no cells from
the prompt cache), and nothing extra for jobs that do not ask."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.llm.engine import Job, Limits
from tests.shoal.llm.test_engine import END, Collect, CountingModel, run

# the fake model's distribution: the predicted token 4 / TOTAL of the mass, the one before it 2 / TOTAL,
# every other 1 / TOTAL (test_engine.py's CountingModel.logits)
TOTAL = (END + 1 - 2) + 2 + 4
LIKELY, BEFORE, OTHER = np.log(4 / TOTAL), np.log(2 / TOTAL), np.log(1 / TOTAL)


def scored(engine, prompt: list[int], max_tokens: int, top: int = 0) -> Collect:
    sink = Collect()
    engine.submit(Job(prompt, sink, max_tokens=max_tokens, temperature=0, logprobs=top, prompt_logprobs=True))
    assert sink.done.wait(10) and sink.error is None, sink.error
    return sink


def test_each_prompt_token_is_scored_by_the_logits_before_it_then_the_generated_ones_follow(engine_for):
    model = CountingModel()
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=16, max_sequence_tokens=64))
    # 5 after 1 (predicted 2): unlikely; 6 after 5 (predicted 6): likeliest; 9 after 6 (predicted 7): unlikely
    sink = scored(engine, [1, 5, 6, 9], max_tokens=2, top=1)
    entries = sink.prompt_logprobs
    assert entries is not None and [e.token for e in entries] == [b"<1>", b"<5>", b"<6>", b"<9>"]
    assert entries[0].logprob is None and entries[0].top == []
    assert [e.logprob for e in entries[1:]] == [pytest.approx(v) for v in (OTHER, LIKELY, OTHER)]
    assert [e.top for e in entries[1:]] == [[(b"<2>", pytest.approx(LIKELY))], [(b"<6>", pytest.approx(LIKELY))],
                                            [(b"<7>", pytest.approx(LIKELY))]]  # fmt: skip
    # then the generated tokens, as without echo
    assert sink.tokens() == [10, 11] and [[e.token for e in got] for got in sink.logprobs] == [[b"<10>"], [b"<11>"]]


def test_a_prompt_in_several_chunks_is_scored_across_them(engine_for):
    model = CountingModel()
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=3, max_sequence_tokens=64))
    prompt = [1, 2, 3, 40, 41, 42, 7, 8]
    sink = scored(engine, prompt, max_tokens=1)
    assert len(model.batches[0]) == 3 and all(e.logits for batch in model.batches for e in batch)
    entries = sink.prompt_logprobs
    assert entries is not None and len(entries) == len(prompt)
    expected = [None, LIKELY, LIKELY, OTHER, LIKELY, LIKELY, OTHER, LIKELY]  # 40 after 3, 7 after 42: unlikely
    assert [e.logprob for e in entries] == [v if v is None else pytest.approx(v) for v in expected]
    assert sink.tokens() == [9]


def test_max_tokens_0_scores_the_prompt_alone(engine_for):
    model = CountingModel()
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=16, max_sequence_tokens=64))
    sink = scored(engine, [1, 2, 3], max_tokens=0)
    assert sink.ending == ("length", 0) and "".join(sink.pieces) == ""
    assert sink.prompt_logprobs is not None and [e.logprob for e in sink.prompt_logprobs] == [
        None,
        pytest.approx(LIKELY),
        pytest.approx(LIKELY),
    ]
    plain = run(engine, [1, 2, 3], max_tokens=0)  # without echo: answered without decoding anything
    assert plain.done.wait(10) and plain.prompt_logprobs is None and len(model.batches) == 1
    assert engine.load()["reserved"] == 0


def test_a_scored_prompt_takes_no_cells_from_the_cache_and_plain_jobs_read_no_extra_logits(engine_for):
    model = CountingModel(n_ctx=256 + 64)
    engine = engine_for(model, Limits(prefix_cache_tokens=64, max_sequences=4, n_batch=64, max_sequence_tokens=128))
    system = list(range(200, 220))
    plain = run(engine, [*system, 1, 2], max_tokens=1)
    assert plain.done.wait(10)
    # a plain prompt asks logits of its last position only
    assert [e.logits for e in model.batches[0]] == [False] * 21 + [True] and model.logits_read == []
    before = len(model.shared)
    sink = scored(engine, [*system, 7, 8], max_tokens=1)
    # decoded in full: nothing lent from the cache's sequence (id 4), whose cells have no logits to score with
    assert [source for source, _, _ in model.shared[before:]] == [0]  # its own prompt kept, as any
    assert sink.prompt_logprobs is not None and len(sink.prompt_logprobs) == 22
    again = run(engine, [*system, 9], max_tokens=1)  # the cache still lends to the others
    assert again.done.wait(10) and (4, 0, 20) in model.shared, model.shared

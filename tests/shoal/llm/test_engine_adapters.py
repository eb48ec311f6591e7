"""LoRA adapters in the continuous batcher (shoal/llm/engine.py): a step decodes each adapter's
sequences apart, and the prompt cache is shared only on the adapter that computed it.

The fake model (test_engine.CountingModel) predicts t + 1 + k after token t under adapter k (t + 1
without one), and refuses to predict from a cell another adapter computed: a sequence decoded
under the wrong adapter, or sharing the wrong adapter's cells, fails or counts wrongly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.llm.engine import Engine, Job, Limits
from tests.shoal.llm.test_engine import Collect, CountingModel


def expected(prompt: list[int], adapter: int | None, max_tokens: int) -> list[int]:
    step = 1 + (adapter or 0)
    return [prompt[-1] + step * (i + 1) for i in range(max_tokens)]


def start(engine: Engine, prompt: list[int], adapter: int | None, max_tokens: int) -> Collect:
    sink = Collect()
    engine.submit(Job(prompt, sink, max_tokens=max_tokens, temperature=0, adapter=adapter))
    return sink


def test_a_step_decodes_each_adapters_sequences_apart(engine_for):
    model = CountingModel()
    model.gate.clear()  # all three join before the first step: they run side by side
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=64, max_sequence_tokens=64))
    asked = [([10, 11], None), ([20, 21], 0), ([30, 31], 2)]
    sinks = [start(engine, prompt, adapter, 5) for prompt, adapter in asked]
    model.gate.set()
    assert all(sink.done.wait(10) for sink in sinks)
    for sink, (prompt, adapter) in zip(sinks, asked):
        assert sink.tokens() == expected(prompt, adapter, 5), (adapter, sink.tokens())
    # side by side, a step is one decode per adapter (in the order they joined)
    assert any(model.adapters[i : i + 3] == [None, 0, 2] for i in range(len(model.adapters)))


def test_one_adapter_batches_as_the_base_model_does(engine_for):
    model = CountingModel()
    model.gate.clear()
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=64, max_sequence_tokens=64))
    sinks = [start(engine, [100 * (i + 1)], 1, 3) for i in range(3)]
    model.gate.set()
    assert all(sink.done.wait(10) for sink in sinks)
    assert max(len(batch) for batch in model.batches) == 3 and set(model.adapters) == {1}


def test_the_prompt_cache_is_shared_on_its_own_adapter_only(engine_for):
    model = CountingModel(n_ctx=256 + 64)
    engine = engine_for(model, Limits(prefix_cache_tokens=64, max_sequences=4, n_batch=64, max_sequence_tokens=128))
    system = list(range(200, 220))
    first = start(engine, [*system, 1, 2], 0, 2)
    assert first.done.wait(10)
    base = start(engine, [*system, 3, 4], None, 2)  # the cache holds adapter 0's cells: not for it
    assert base.done.wait(10) and base.tokens() == [5, 6]
    assert not any(length == 20 for _, _, length in model.shared), model.shared
    again = start(engine, [*system, 5, 6], None, 2)  # now the cache is the base model's
    assert again.done.wait(10) and again.tokens() == [7, 8]
    assert any(source == 4 and length == 20 for source, _, length in model.shared), model.shared


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.sampled_from([None, 0, 1, 3]), st.integers(1, 6)), max_size=6))
def test_any_mix_of_adapters_gets_each_its_own_answer(asked):
    model = CountingModel(n_ctx=512)
    model.gate.clear()
    engine = Engine(model, Limits(prefix_cache_tokens=16, max_sequences=8, n_batch=4, max_sequence_tokens=32))
    try:
        sinks = [start(engine, [token, token + 1], adapter, n) for token, adapter, n in asked]
        model.gate.set()
        for sink, (token, adapter, n) in zip(sinks, asked):
            assert sink.done.wait(10) and sink.error is None
            assert sink.tokens() == expected([token, token + 1], adapter, n)
    finally:
        model.gate.set()
        engine.close()

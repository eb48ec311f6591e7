"""The continuous batcher's scheduling (shoal/llm/engine.py), on a small deterministic language
model: the next token is the previous one plus one, the end token after `END`, so each
sequence's output is known from its prompt; the model records every batch it decodes.

The real llama.cpp model is tested in test_real_model.py (with the llm extra)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.llm.engine import Engine, Job, Limits
from shoal.llm.llama_c_api import Entry, LlamaError, Penalties, Shaping
from shoal.llm.token_logprobs import Logprob

END = 1000  # the end-of-generation token


class CountingModel:
    """A `Decoder`: after token t comes t + 1, and END after END - 1 (with LoRA adapter k, t + 1 + k:
    test_engine_adapters.py). It checks what llama.cpp would refuse: positions that skip, a
    sequence id out of range, more cells than it has; and that every token a decode predicts from
    was computed with the decode's adapter (a cell keeps the adapter that made it)."""

    def __init__(self, n_ctx: int = 256, max_sequences: int = 9, step_delay: float = 0.0) -> None:
        self.n_ctx, self.max_sequences, self.step_delay = n_ctx, max_sequences, step_delay
        self.batches: list[list[Entry]] = []
        self.shared: list[tuple[int, int, int]] = []
        self.cells: dict[int, int] = {}  # seq -> next position expected
        self.predicted: dict[int, int] = {}  # batch index -> token it predicts
        self.logits_read: list[int] = []  # batch indices whose logits the engine read
        self.fail_next = False
        self.shaping: list[Shaping | None] = []  # each sampler's, in order
        self.adapters: list[int | None] = []  # each decode's adapter, in order
        self.made_by: dict[int, set[int | None]] = {}  # seq -> the adapters that computed its cells
        self.gate = threading.Event()
        self.gate.set()

    def decode(self, entries: list[Entry], adapter: int | None = None) -> None:
        self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise LlamaError("llama_decode returned 1 (no room in the KV cache)")
        self.batches.append(list(entries))
        self.adapters.append(adapter)
        self.predicted = {}
        for index, entry in enumerate(entries):
            assert 0 <= entry.seq < self.max_sequences
            assert entry.pos == self.cells.get(entry.seq, 0), (entry, self.cells)
            self.cells[entry.seq] = entry.pos + 1
            self.made_by.setdefault(entry.seq, set()).add(adapter)
            if entry.logits:
                assert self.made_by[entry.seq] == {adapter}, (entry, adapter, self.made_by[entry.seq])
                self.predicted[index] = min(entry.token + 1 + (adapter or 0), END)
        assert sum(self.cells.values()) <= self.n_ctx
        time.sleep(self.step_delay)

    def sampler(self, temperature: float, top_p: float, seed: int, shaping: Shaping | None = None) -> Sampler:
        self.shaping.append(shaping)
        return Sampler()

    def sample(self, sampler: Sampler, index: int) -> int:
        return self.predicted[index]

    def logits(self, index: int) -> np.ndarray:
        """The predicted token twice as likely as the token before it, all others equally unlikely."""
        self.logits_read.append(index)
        scores = np.zeros(END + 1, np.float32)
        token = self.predicted[index]
        scores[token], scores[token - 1] = 2.0 * np.log(2.0), np.log(2.0)
        return scores

    def forget(self, seq: int) -> None:
        self.cells.pop(seq, None)
        self.made_by.pop(seq, None)

    def share(self, source: int, target: int, length: int) -> None:
        assert self.cells.get(source, 0) >= length and target not in self.cells
        self.cells[target] = length
        self.made_by[target] = set(self.made_by[source])
        self.shared.append((source, target, length))

    def piece(self, token: int, special: bool = False) -> bytes:
        return f"<{token}>".encode()

    def is_end(self, token: int) -> bool:
        return token == END


class Sampler:
    def close(self) -> None:
        pass


@dataclass
class Collect:
    """A `Sink` that keeps what it is told."""

    gone: bool = False
    pieces: list[str] = field(default_factory=list)
    ending: tuple[str, int] | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    logprobs: list[list[Logprob]] = field(default_factory=list)  # what came with each piece
    prompt_logprobs: list[Logprob] | None = None  # the prompt's, when asked (before any piece)

    def text(self, text: str, completion_tokens: int, logprobs: Sequence[Logprob] = ()) -> None:
        self.pieces.append(text)
        self.logprobs.append(list(logprobs))

    def end(self, text: str, reason: str, completion_tokens: int, logprobs: Sequence[Logprob] = ()) -> None:
        self.pieces.append(text)
        self.logprobs.append(list(logprobs))
        self.ending = (reason, completion_tokens)
        self.done.set()

    def prompt(self, logprobs: Sequence[Logprob]) -> None:
        assert not self.pieces and self.prompt_logprobs is None
        self.prompt_logprobs = list(logprobs)

    def fail(self, message: str) -> None:
        self.error = message
        self.done.set()

    def cancelled(self) -> bool:
        return self.gone

    def tokens(self) -> list[int]:
        return [int(p) for p in "".join(self.pieces).replace("<", " ").replace(">", " ").split()]


def run(engine: Engine, prompt: list[int], max_tokens: int | None = None) -> Collect:
    sink = Collect()
    engine.submit(Job(prompt, sink, max_tokens=max_tokens, temperature=0))
    return sink


def test_one_sequence_generates_until_its_end_token(engine_for):
    engine = engine_for(
        CountingModel(), Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=16, max_sequence_tokens=64)
    )
    sink = run(engine, [990, 995])
    assert sink.done.wait(10)
    assert sink.tokens() == [996, 997, 998, 999] and sink.ending == ("stop", 4)


def test_penalties_reach_the_sampler_over_every_token_the_sequence_may_generate(engine_for):
    model = CountingModel()
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=16, max_sequence_tokens=64))
    sink = Collect()
    engine.submit(Job([1, 2, 3], sink, max_tokens=5, temperature=0, frequency_penalty=1.5, presence_penalty=-0.5))
    assert sink.done.wait(10)
    plain = run(engine, [1, 2, 3], max_tokens=5)
    assert plain.done.wait(10)
    biased = Collect()
    engine.submit(Job([1, 2, 3], biased, max_tokens=5, temperature=0, logit_bias={7: -100.0}))
    assert biased.done.wait(10)
    assert model.shaping == [  # none asked: no shaping sampler at all
        Shaping(Penalties(1.5, -0.5, 5), {}),
        None,
        Shaping(None, {7: -100.0}),
    ]


def test_logprobs_come_with_the_text_of_their_tokens_only_when_asked(engine_for):
    model = CountingModel()
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=16, max_sequence_tokens=64))
    plain = run(engine, [1, 2, 3], max_tokens=3)
    assert plain.done.wait(10) and model.logits_read == [] and plain.logprobs == [[], [], []]
    asked = Collect()
    engine.submit(Job([1, 2, 3], asked, max_tokens=3, temperature=0, logprobs=2))
    assert asked.done.wait(10)
    # a piece per token (the last one comes with the end), each with its own token's entry
    assert [[e.token for e in entries] for entries in asked.logprobs] == [[b"<4>"], [b"<5>"], [b"<6>"]]
    # log-softmax over END + 1 logits: the predicted token 4 / (1001 - 2 + 2 + 4) of the mass
    total = (END + 1 - 2) + 2 + 4
    first = asked.logprobs[0][0]
    assert first.logprob == pytest.approx(np.log(4 / total))
    assert first.top == [(b"<4>", pytest.approx(np.log(4 / total))), (b"<3>", pytest.approx(np.log(2 / total)))]
    none_top = Collect()
    engine.submit(Job([1, 2, 3], none_top, max_tokens=1, temperature=0, logprobs=0))
    assert none_top.done.wait(10) and none_top.logprobs == [[Logprob(b"<4>", pytest.approx(np.log(4 / total)), [])]]


def test_max_tokens_ends_a_sequence_with_length(engine_for):
    engine = engine_for(
        CountingModel(), Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=16, max_sequence_tokens=64)
    )
    sink = run(engine, [1, 2, 3], max_tokens=5)
    assert sink.done.wait(10)
    assert sink.tokens() == [4, 5, 6, 7, 8] and sink.ending == ("length", 5)


def test_sequences_decode_together_and_newcomers_join_between_steps(engine_for):
    model = CountingModel(step_delay=0.01)
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=64, max_sequence_tokens=64))
    first = run(engine, [10], max_tokens=30)
    while len(model.batches) < 3:  # the first sequence is under way
        time.sleep(0.005)
    second = run(engine, [500, 501], max_tokens=5)
    assert first.done.wait(10) and second.done.wait(10)
    assert first.tokens() == list(range(11, 41)) and second.tokens() == [502, 503, 504, 505, 506]
    # the newcomer's prompt went in with the first sequence's next token, in one batch
    joined = next(batch for batch in model.batches if any(e.token == 500 for e in batch))
    assert {e.seq for e in joined} == {first_seq(model), second_seq(model)}
    assert max(len({e.seq for e in batch}) for batch in model.batches) == 2


def test_requests_that_fit_join_at_once_and_start_in_one_step(engine_for):
    model = CountingModel()
    model.gate.clear()  # no step completes until all three have joined
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=64, max_sequence_tokens=64))
    sinks = [run(engine, [100 * (i + 1)], max_tokens=3) for i in range(3)]  # each returns without a step
    assert engine.load()["running"] == 3
    model.gate.set()
    assert all(sink.done.wait(10) for sink in sinks)
    assert sorted(e.token for e in model.batches[0]) == [100, 200, 300] or len(model.batches[0]) == 1
    assert max(len(batch) for batch in model.batches) == 3


def test_a_prompt_that_starts_like_the_last_one_shares_its_cells(engine_for):
    model = CountingModel(n_ctx=256 + 64)
    engine = engine_for(model, Limits(prefix_cache_tokens=64, max_sequences=4, n_batch=64, max_sequence_tokens=128))
    system = list(range(200, 220))  # a chat template's common start
    first = run(engine, system + [1, 2], max_tokens=2)
    assert first.done.wait(10)
    second = run(engine, system + [7, 8, 9], max_tokens=2)
    assert second.done.wait(10) and second.tokens() == [10, 11]
    # the second shared the 20 cells of the common start from the cache sequence (id 4) and
    # decoded only what differs: the system prompt's tokens went through llama_decode once
    assert any(source == 4 and length == 20 for source, _, length in model.shared), model.shared
    decoded = [e.token for batch in model.batches for e in batch]
    assert decoded.count(200) == 1 and decoded.count(219) == 1 and decoded.count(7) == 1


def test_with_several_entries_each_conversation_finds_its_previous_turn(engine_for):
    model = CountingModel(n_ctx=256 + 128, max_sequences=4 + 2)
    limits = Limits(
        max_sequences=4, n_batch=64, max_sequence_tokens=128, prefix_cache_tokens=128, prefix_cache_entries=2
    )
    engine = engine_for(model, limits)
    system = list(range(200, 220))
    a, b = system + list(range(300, 310)), system + list(range(400, 410))
    for prompt in (a, b, a + [50, 51], b + [60, 61]):  # the conversations take turns
        assert run(engine, prompt, max_tokens=2).done.wait(10)
    # each later turn shared its own conversation's whole previous prompt, from one of the two
    # cache sequences (ids 4 and 5), though the other conversation's came in between
    assert sorted(length for source, _, length in model.shared if source in (4, 5))[-2:] == [30, 30], model.shared
    decoded = [e.token for batch in model.batches for e in batch]
    assert decoded.count(300) == 1 and decoded.count(400) == 1


def first_seq(model: CountingModel) -> int:
    return model.batches[0][0].seq


def second_seq(model: CountingModel) -> int:
    return next(e.seq for batch in model.batches for e in batch if e.token == 500)


def test_a_finished_sequence_leaves_at_once_and_frees_its_slot(engine_for):
    model = CountingModel(step_delay=0.005)
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=1, n_batch=64, max_sequence_tokens=64))
    long = run(engine, [1], max_tokens=40)
    waiting = []
    thread = threading.Thread(target=lambda: waiting.append(run(engine, [700], max_tokens=2)))
    thread.start()
    time.sleep(0.05)
    assert engine.load()["waiting"] == 1  # one sequence at most: the second waits in submit
    assert long.done.wait(10)
    thread.join(10)
    assert waiting[0].done.wait(10) and waiting[0].tokens() == [701, 702]
    # the waiting one joined at the step after the first ended
    last_of_long = max(i for i, batch in enumerate(model.batches) if any(e.token < 700 for e in batch))
    assert any(e.token == 700 for e in model.batches[last_of_long + 1])


def test_a_cancelled_stream_leaves_at_the_next_step(engine_for):
    model = CountingModel(step_delay=0.005)
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=64, max_sequence_tokens=256))
    sink = run(engine, [1], max_tokens=200)
    while len(sink.pieces) < 3:
        time.sleep(0.002)
    sink.gone = True
    assert sink.done.wait(10)
    assert sink.ending is not None and sink.ending[0] == "cancelled" and sink.ending[1] < 200
    assert engine.load() == {"running": 0, "waiting": 0, "reserved": 0, "capacity": 256}
    assert model.cells == {}  # its KV cells were freed


def test_a_request_cancelled_while_waiting_is_answered_without_running(engine_for):
    model = CountingModel()
    model.gate.clear()  # the running sequence is stuck in its step
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=1, n_batch=64, max_sequence_tokens=64))
    threading.Thread(target=run, args=(engine, [1], 5), daemon=True).start()
    while not engine.load()["running"]:
        time.sleep(0.002)
    sink = Collect(gone=True)
    thread = threading.Thread(target=engine.submit, args=(Job([800], sink, max_tokens=3),))
    thread.start()
    model.gate.set()
    thread.join(10)
    assert sink.done.wait(10) and sink.ending == ("cancelled", 0)
    assert not any(e.token == 800 for batch in model.batches for e in batch)


def test_reservations_bound_the_context_and_the_oldest_waits_first(engine_for):
    # 100 cells: a sequence reserves prompt + max_tokens, so two of 40 fit and the third waits
    model = CountingModel(n_ctx=100, step_delay=0.002)
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=8, n_batch=64, max_sequence_tokens=100))
    sinks: list[Collect] = []
    threads = [threading.Thread(target=lambda: sinks.append(run(engine, [1] * 10, max_tokens=30))) for _ in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(0.01)
    for thread in threads:
        thread.join(20)
    assert all(s.done.wait(20) and s.ending == ("length", 30) for s in sinks)
    assert max(len({e.seq for e in batch}) for batch in model.batches) == 2


def test_the_prompt_goes_in_chunks_of_n_batch_beside_the_generating_sequences(engine_for):
    model = CountingModel(step_delay=0.002)
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=4, n_batch=8, max_sequence_tokens=128))
    first = run(engine, [1], max_tokens=20)
    second = run(engine, list(range(100, 120)), max_tokens=2)
    assert first.done.wait(10) and second.done.wait(10)
    assert all(len(batch) <= 8 for batch in model.batches)
    assert second.tokens() == [120, 121]


def test_a_prompt_too_long_is_refused_at_once(engine_for):
    engine = engine_for(
        CountingModel(n_ctx=64), Limits(prefix_cache_tokens=0, max_sequences=2, n_batch=16, max_sequence_tokens=32)
    )
    with pytest.raises(ValueError, match="the prompt has 32 tokens; a sequence holds at most 32"):
        engine.submit(Job([1] * 32, Collect()))
    with pytest.raises(ValueError, match="empty"):
        engine.submit(Job([], Collect()))


def test_a_failed_decode_fails_the_sequences_in_that_batch_and_the_engine_goes_on(engine_for):
    model = CountingModel()
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=2, n_batch=16, max_sequence_tokens=64))
    model.fail_next = True
    failed = run(engine, [1], max_tokens=3)
    assert failed.done.wait(10) and "no room in the KV cache" in (failed.error or "")
    after = run(engine, [7], max_tokens=2)
    assert after.done.wait(10) and after.tokens() == [8, 9]


def test_closing_fails_what_is_still_running(engine_for):
    model = CountingModel(step_delay=0.01)
    engine = engine_for(model, Limits(prefix_cache_tokens=0, max_sequences=2, n_batch=16, max_sequence_tokens=512))
    sink = run(engine, [1], max_tokens=400)
    engine.close()
    assert sink.done.wait(10) and sink.error == "the model is unloading"
    with pytest.raises(RuntimeError, match="unloading"):
        engine.submit(Job([1], Collect()))


@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from([3, 5, 7, 900]), min_size=1, max_size=12), st.integers(0, 12)),
        min_size=1,
        max_size=10,
    ),
    st.integers(1, 4),
    st.integers(1, 16),
    st.sampled_from([0, 6, 16]),
)
def test_every_sequence_gets_exactly_its_own_tokens_whatever_runs_beside_it(jobs, max_sequences, n_batch, cache):
    """Prompts from four tokens share starts often, so the prompt cache is used and replaced."""
    model = CountingModel(n_ctx=64 + cache, max_sequences=max_sequences + 1)
    limits = Limits(prefix_cache_tokens=cache, max_sequences=max_sequences, n_batch=n_batch, max_sequence_tokens=32)
    engine = Engine(model, limits)
    try:
        sinks: list[tuple[list[int], int, Collect]] = []
        threads = []
        for prompt, max_tokens in jobs:
            sink = Collect()
            sinks.append((prompt, max_tokens, sink))
            thread = threading.Thread(target=engine.submit, args=(Job(prompt, sink, max_tokens=max_tokens),))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(20)
        for prompt, max_tokens, sink in sinks:
            assert sink.done.wait(20)
            expected = list(range(prompt[-1] + 1, prompt[-1] + 1 + max_tokens))
            assert sink.tokens() == expected and sink.ending == ("length", max_tokens)
        assert engine.load()["reserved"] == 0 and set(model.cells) <= {max_sequences}  # the cache's cells stay
    finally:
        engine.close()

"""The engine's prompt cache: several prompts' starts, the longest shared one lent, the least used
given up first, within its cells."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.llm.prompt_cache import PromptCache


class Cells:
    """The context's sequences as the cache moves them: seq -> its tokens' count."""

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def forget(self, seq: int) -> None:
        self.held.pop(seq, None)

    def share(self, source: int, target: int, length: int) -> None:
        assert self.held.get(source, 0) >= length and target not in self.held
        self.held[target] = length


SYSTEM = list(range(100, 120))


def decoded(cells: Cells, cache: PromptCache, prompt: list[int], seq: int = 0, adapter: int | None = None) -> int:
    """A sequence takes what the cache lends, decodes the rest, is kept, and leaves; what it was lent."""
    lent = cache.lend(prompt, seq, adapter)
    cells.held[seq] = len(prompt)
    cache.keep(prompt, seq, adapter)
    cells.forget(seq)
    return lent


def test_each_conversation_keeps_its_own_latest_turn():
    cells = Cells()
    cache = PromptCache(cells, first_seq=8, entries=4, tokens=400)
    a, b = SYSTEM + [1] * 30, SYSTEM + [2] * 30
    assert decoded(cells, cache, a) == 0
    assert decoded(cells, cache, b) == 20  # the system prompt, from a's entry
    assert decoded(cells, cache, a + [3] * 10) == 50  # a's previous turn whole, though b came after
    assert decoded(cells, cache, b + [4] * 10) == 50
    assert len(cache) == 2  # each turn took its conversation's entry's place
    assert cache.used == 120 and set(cells.held) <= set(range(8, 12))


def test_a_start_is_lent_only_to_a_prompt_on_the_adapter_that_computed_it():
    cells = Cells()
    cache = PromptCache(cells, first_seq=8, entries=4, tokens=400)
    assert decoded(cells, cache, SYSTEM + [1] * 10) == 0
    assert decoded(cells, cache, SYSTEM + [2] * 10, adapter=0) == 0  # the base model's cells: not for adapter 0
    assert decoded(cells, cache, SYSTEM + [3] * 10, adapter=1) == 0
    assert decoded(cells, cache, SYSTEM + [4] * 10, adapter=0) == 20  # adapter 0's own entry
    assert decoded(cells, cache, SYSTEM + [1] * 10 + [5]) == 30  # and the base model's
    assert len(cache) == 4  # the base prompt extended in place; each adapter conversation its own


def test_the_least_recently_used_gives_way_when_cells_run_out():
    cells = Cells()
    cache = PromptCache(cells, first_seq=4, entries=4, tokens=61)
    a, b, c = [1] * 30, [2] * 30, [3] * 30
    decoded(cells, cache, a)
    decoded(cells, cache, b)
    decoded(cells, cache, a + [5])  # a used again: b is now the least recent
    decoded(cells, cache, c)
    assert decoded(cells, cache, a + [6]) == 30 and decoded(cells, cache, b + [6]) == 0
    assert cache.used <= 61


def test_one_entry_keeps_the_latest_prompt_as_before():
    cells = Cells()
    cache = PromptCache(cells, first_seq=4, entries=1, tokens=512)
    decoded(cells, cache, SYSTEM + [1, 2])
    decoded(cells, cache, SYSTEM + [7, 8])
    assert set(cells.held) == {4} and cells.held[4] == 22


def test_no_cells_no_cache():
    cells = Cells()
    cache = PromptCache(cells, first_seq=4, entries=4, tokens=0)
    assert decoded(cells, cache, SYSTEM) == 0 and decoded(cells, cache, SYSTEM + [1]) == 0 and not cells.held


@given(
    st.lists(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=12), max_size=30),
    st.integers(1, 4),
    st.integers(0, 24),
)
def test_it_stays_within_its_cells_and_lends_only_a_true_start(prompts, entries, tokens):
    cells = Cells()
    cache = PromptCache(cells, first_seq=2, entries=entries, tokens=tokens)
    kept: list[list[int]] = []
    for prompt in prompts:
        lent = decoded(cells, cache, prompt)
        assert lent == 0 or any(k[:lent] == prompt[:lent] for k in kept)
        assert lent <= len(prompt) - 1
        kept.append(prompt[:tokens])
        assert cache.used <= tokens and set(cells.held) <= set(range(2, 2 + entries))
        assert sum(cells.held.values()) == cache.used

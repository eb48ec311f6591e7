"""Routing keys: a conversation's next turn shares all of its previous turn's blocks, other
conversations only their common start."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.openai.routing_key import BLOCK_CHARS, MAX_BLOCKS, chat_blocks, text_blocks

SYSTEM = {"role": "system", "content": "You are helpful. " * 20}


def shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_a_next_turn_extends_its_previous_turn():
    first = [SYSTEM, {"role": "user", "content": "hi"}]
    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
    other = [SYSTEM, {"role": "user", "content": "bye"}]
    assert chat_blocks(second)[: len(chat_blocks(first))] == chat_blocks(first)
    assert shared(chat_blocks(other), chat_blocks(first)) == len(chat_blocks([SYSTEM]))  # the system prompt only
    assert chat_blocks(first, [{"type": "function"}]) != chat_blocks(first)  # the tools come first


def test_where_a_message_ends_counts():
    assert chat_blocks([{"role": "user", "content": "ab"}]) != chat_blocks([{"role": "user", "content": "a"}])
    one, two = text_blocks(b"x" * BLOCK_CHARS * 2), text_blocks(b"x" * BLOCK_CHARS * 3)
    assert two[:2] == one and len(one) == 2


def test_short_plain_prompts_have_no_key_and_long_ones_a_bounded_one():
    assert text_blocks(b"Once upon a time") == []
    assert len(text_blocks(b"y" * BLOCK_CHARS * (MAX_BLOCKS + 5))) == MAX_BLOCKS
    assert all(0 <= block < 2**63 for block in text_blocks(b"z" * BLOCK_CHARS * 3))


@given(st.binary(max_size=3000), st.binary(max_size=600))
def test_a_text_shares_every_whole_block_of_its_start(start, more):
    assert text_blocks(start + more)[: len(start) // BLOCK_CHARS] == text_blocks(start)


def test_a_lora_adapters_prompt_shares_no_block_with_the_base_models():
    """An instance's cached cells serve only its own adapter's prompts: the keys must tell them apart."""
    messages = [{"role": "system", "content": "s" * 600}, {"role": "user", "content": "hello"}]
    base, adapted, other = chat_blocks(messages), chat_blocks(messages, adapter="a"), chat_blocks(messages, adapter="b")
    assert len(base) == len(adapted) == len(other)
    assert not set(base) & set(adapted) and not set(adapted) & set(other)
    assert chat_blocks(messages, adapter="a") == adapted
    assert not set(text_blocks(b"t" * 600)) & set(text_blocks(b"t" * 600, adapter="a"))

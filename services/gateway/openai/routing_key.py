"""A prompt's routing key: a chain of hashes of its prefix blocks, which the scheduler matches
against the blocks it sent to each instance (docs/design.md, "Prefix-aware routing").

Block `i`'s hash covers everything up to the end of block `i`, so two prompts share it only if
they start with the same blocks. A chat's blocks are its messages (the tools first: a template
renders them ahead), each cut into `BLOCK_CHARS` pieces, the last one shorter: a conversation's
next turn repeats every message of the previous one, so it shares all of that turn's blocks, and
every conversation shares its system prompt's. A completion's prompt is plain text, cut into
whole blocks only (a prompt shorter than one block has no key and is routed by load alone).
A prompt for a LoRA adapter hashes the adapter's name first: an instance's cached cells serve
only prompts on the adapter that computed them (shoal/llm/prompt_cache.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson

BLOCK_CHARS = 256  # about 64 tokens of English text
MAX_BLOCKS = 64  # beyond them, prompts are told apart by their start


def _chain(pieces: Iterable[bytes], adapter: str | None = None) -> list[int]:
    running = hashlib.blake2b(digest_size=8)
    if adapter is not None:
        running.update(b"lora:" + adapter.encode())
    blocks: list[int] = []
    for piece in pieces:
        running.update(len(piece).to_bytes(4, "big"))  # where a piece ends is part of what it says
        running.update(piece)
        blocks.append(int.from_bytes(running.copy().digest(), "big") >> 1)  # fits msgpack's int64
        if len(blocks) == MAX_BLOCKS:
            break
    return blocks


def _cut(data: bytes) -> list[bytes]:
    return [data[start : start + BLOCK_CHARS] for start in range(0, len(data), BLOCK_CHARS)]


def text_blocks(text: bytes, adapter: str | None = None) -> list[int]:
    """A plain prompt's blocks: its whole `BLOCK_CHARS` pieces."""
    whole = range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS)
    return _chain((text[start : start + BLOCK_CHARS] for start in whole), adapter)


def chat_blocks(
    messages: list[dict[str, Any]], tools: list[Any] | None = None, adapter: str | None = None
) -> list[int]:
    """A conversation's blocks: each message's pieces (and the tools' first, if any). Lazily: the
    messages past the first `MAX_BLOCKS` blocks are never serialised."""

    def parts() -> Iterable[bytes]:
        if tools:
            yield orjson.dumps(tools)
        for message in messages:
            yield orjson.dumps(message, option=orjson.OPT_SORT_KEYS)

    return _chain((piece for part in parts() for piece in _cut(part)), adapter)

"""A prompt's routing key: a chain of hashes of its prefix blocks, which the scheduler matches
against the blocks it sent to each instance (docs/design.md, "Prefix-aware routing").

Block `i`'s hash covers everything up to the end of block `i`, so two prompts share it only if
they start with the same blocks. A chat's blocks are its messages (the tools first: a template
renders them ahead), each cut into `BLOCK_CHARS` pieces, the last one shorter: a conversation's
next turn repeats every message of the previous one, so it shares all of that turn's blocks, and
every conversation shares its system prompt's. A completion's prompt is plain text, cut into
whole blocks only (a prompt shorter than one block has no key and is routed by load alone).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson

BLOCK_CHARS = 256  # about 64 tokens of English text
MAX_BLOCKS = 64  # beyond them, prompts are told apart by their start


def _chain(pieces: Iterable[bytes]) -> list[int]:
    running = hashlib.blake2b(digest_size=8)
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


def text_blocks(text: bytes) -> list[int]:
    """A plain prompt's blocks: its whole `BLOCK_CHARS` pieces."""
    return _chain(text[start : start + BLOCK_CHARS] for start in range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS))


def chat_blocks(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> list[int]:
    """A conversation's blocks: each message's pieces (and the tools' first, if any)."""
    parts = [orjson.dumps(tools)] if tools else []
    parts.extend(orjson.dumps(message, option=orjson.OPT_SORT_KEYS) for message in messages)
    return _chain(piece for part in parts for piece in _cut(part))

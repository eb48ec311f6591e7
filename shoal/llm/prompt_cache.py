"""The engine's prompt cache: the KV cells of recent prompts' starts, each in a sequence of its own,
which a newcomer whose prompt starts the same way shares instead of decoding them again.

Several entries, so that an instance serving several conversations keeps each one's latest prompt
(a conversation's next turn starts with it: docs/openai.md, "Prefix reuse and routing"); the least
recently used entry gives way first. Their lengths together stay within `tokens` cells, which the
engine reserves apart from the sequences' (cells two entries share are counted twice: a bound, not
a measure). An entry is shared only with a prompt on the LoRA adapter that computed it (an adapter
changes the cells' keys and values too). Used by the engine's thread only.
"""

from __future__ import annotations

from typing import Protocol

MIN_SHARED = 4  # fewer shared tokens are not worth a call


class Cells(Protocol):
    """What the cache needs of the model's context (`engine.Decoder`)."""

    def forget(self, seq: int) -> None: ...

    def share(self, source: int, target: int, length: int) -> None: ...


def _common(a: list[int], b: list[int]) -> int:
    shared = 0
    for x, y in zip(a, b):
        if x != y:
            break
        shared += 1
    return shared


class PromptCache:
    def __init__(self, cells: Cells, first_seq: int, entries: int, tokens: int) -> None:
        self.cells, self.tokens = cells, tokens
        self._free = list(range(first_seq + entries - 1, first_seq - 1, -1)) if tokens > 0 else []
        self._entries: dict[int, list[int]] = {}  # seq -> the tokens whose cells it keeps, oldest use first
        self._adapters: dict[int, int | None] = {}  # seq -> the adapter its cells were computed with

    def __len__(self) -> int:
        """Prompts kept."""
        return len(self._entries)

    @property
    def used(self) -> int:
        """Cells the entries hold (counted apart)."""
        return sum(len(tokens) for tokens in self._entries.values())

    def lend(self, prompt: list[int], seq: int, adapter: int | None = None) -> int:
        """Give `seq` (a newcomer's, holding nothing yet) the cells of the longest cached start of
        `prompt` computed on `adapter` (all but its last token: that one is decoded for its
        logits); how many it got."""
        best, shared = -1, 0
        for source, tokens in self._entries.items():
            if self._adapters[source] != adapter:
                continue
            common = _common(prompt[: len(prompt) - 1], tokens)
            if common > shared:
                best, shared = source, common
        if shared < MIN_SHARED:
            return 0
        self._entries[best] = self._entries.pop(best)  # used: the last to go
        self.cells.share(best, seq, shared)
        return shared

    def keep(self, prompt: list[int], seq: int, adapter: int | None = None) -> None:
        """Keep the start of `prompt`, whose cells `seq` has just decoded on `adapter`, for the next
        prompts: in place of an entry it extends (a conversation's previous turn), else of the least
        used."""
        length = min(len(prompt), self.tokens)
        if length < MIN_SHARED:
            return
        start = prompt[:length]
        for source, tokens in self._entries.items():
            if self._adapters[source] == adapter and _common(start, tokens) == len(
                tokens
            ):  # the same start, or one this prompt extends
                if len(tokens) == length:
                    self._entries[source] = self._entries.pop(source)
                    return
                self._drop(source)
                break
        while self._entries and (not self._free or self.used + length > self.tokens):
            self._drop(next(iter(self._entries)))
        if not self._free:
            return
        target = self._free.pop()
        self.cells.share(seq, target, length)
        self._entries[target] = start
        self._adapters[target] = adapter

    def _drop(self, seq: int) -> None:
        del self._entries[seq]
        del self._adapters[seq]
        self.cells.forget(seq)
        self._free.append(seq)

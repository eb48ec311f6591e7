"""Log probabilities of generated tokens (OpenAI's `logprobs` / `top_logprobs`), from the model's
raw logits: the distribution before the sampler's chain (no temperature, top-p, penalties, logit
bias or grammar), as OpenAI and vLLM report them.

Computed only for a sequence that asked; the cost is a copy of the logits, one pass of
exponentials over the vocabulary a token (SmolLM2: 49 152 floats) and, for top ones, a partial
sort.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_TOP = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class Logprob:
    """One generated token: its bytes, its log probability, and the most likely tokens at its
    position (bytes, log probability), most likely first."""

    token: bytes
    logprob: float | None  # None: a prompt's first token (nothing precedes it)
    top: list[tuple[bytes, float]] = field(default_factory=list)


class Distribution:
    """One position's raw distribution: a copy of its logits (llama.cpp's buffer is reused by the
    next decode) and their log normaliser. Never the whole log-softmax array: a request needs the
    sampled token's and the top ones' only."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = np.array(logits, dtype=np.float32)
        peak = float(self.logits.max())
        # the exponentials in float32, their sum in float64: the log probabilities' mass stays 1
        self.normaliser = peak + math.log(float(np.exp(self.logits - peak).sum(dtype=np.float64)))

    def logprob(self, token: int) -> float:
        return float(self.logits[token]) - self.normaliser

    def top(self, count: int) -> list[tuple[int, float]]:
        """The `count` most likely tokens (id, log probability), most likely first."""
        count = min(count, self.logits.size)
        if count <= 0:
            return []
        best = np.argpartition(self.logits, -count)[-count:]  # unordered: sort only these
        best = best[np.argsort(-self.logits[best], kind="stable")]
        return [(int(token), self.logprob(int(token))) for token in best]


def token_entry(piece: Callable[[int, bool], bytes], token: int, scores: Distribution, top: int) -> Logprob:
    """`token`'s entry at the position `scores` are of, with the `top` likeliest there; `piece`
    writes a token's bytes (special=True: an end-of-generation token among the likeliest shows as
    itself, not "")."""
    likeliest = [(piece(t, True), logprob) for t, logprob in scores.top(top)]
    return Logprob(piece(token, False), scores.logprob(token), likeliest)


def token_text(piece: bytes) -> str:
    """A token as text; a token that is part of a UTF-8 character, as OpenAI writes one:
    `bytes:\\xe2\\x80` (its `bytes` field has the exact value)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece)


def to_json(entries: list[Logprob]) -> list[dict[str, Any]]:
    """The model's `logprobs` output: OpenAI's chat shape, one object per token."""
    return [
        {
            "token": token_text(entry.token),
            "bytes": list(entry.token),
            "logprob": entry.logprob,
            "top_logprobs": [
                {"token": token_text(piece), "bytes": list(piece), "logprob": logprob} for piece, logprob in entry.top
            ],
        }
        for entry in entries
    ]

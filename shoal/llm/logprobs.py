"""Log probabilities of generated tokens (OpenAI's `logprobs` / `top_logprobs`), from the model's
raw logits: the distribution before the sampler's chain (no temperature, top-p, penalties, logit
bias or grammar), as OpenAI and vLLM report them.

Computed only for a sequence that asked; the cost is one log-softmax over the vocabulary a
token (SmolLM2: 49 152 floats) and a partial sort for the top ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_TOP = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class Logprob:
    """One generated token: its bytes, its log probability, and the most likely tokens at its
    position (bytes, log probability), most likely first."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]] = field(default_factory=list)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log probabilities over the vocabulary; float64 so that their exponentials sum to 1."""
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return shifted - float(np.log(np.sum(np.exp(shifted))))


def top_tokens(logprobs: np.ndarray, count: int) -> list[tuple[int, float]]:
    """The `count` most likely tokens (id, log probability), most likely first."""
    count = min(count, logprobs.size)
    if count <= 0:
        return []
    best = np.argpartition(logprobs, -count)[-count:]  # unordered: sort only these
    best = best[np.argsort(-logprobs[best], kind="stable")]
    return [(int(token), float(logprobs[token])) for token in best]


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

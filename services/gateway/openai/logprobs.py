"""OpenAI's `logprobs`: the model's per-token entries, kept in step with the text the client is
shown, and written in the shape of each endpoint.

A model's `logprobs` output holds OpenAI's chat entries as JSON, one per token of the response:
`{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}`
(docs/openai.md). The front end holds back text that could begin a stop sequence and cuts the
text at one, so a token's entry goes out with the piece of text its first character is shown
in, and a token wholly after a stop sequence is dropped with its text.
"""

from __future__ import annotations

import codecs
from collections import deque
from typing import Any

import orjson

from shared.errors import ShoalError, internal

Entry = dict[str, Any]  # one token's, in OpenAI's chat shape
Placed = tuple[int, Entry]  # the character offset of the token's text in the choice's text, and its entry


def parse_entries(raw: bytes, model: str) -> list[Entry]:
    """The entries of one response's `logprobs` output; a model that writes something else fails
    the request, saying so."""
    try:
        entries = orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError as exc:
        raise internal(f"model '{model}' sent a 'logprobs' output that is not JSON: {exc}") from None
    if not isinstance(entries, list) or not all(_is_entry(e) for e in entries):
        raise internal(f"model '{model}' sent a 'logprobs' output that is not a list of token entries")
    for entry in entries:
        entry.setdefault("bytes", list(entry["token"].encode()))
        entry.setdefault("top_logprobs", [])
    return entries


def _is_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("token"), str)
        and isinstance(entry.get("logprob"), (int, float))
        and isinstance(entry.get("top_logprobs", []), list)
    )


def missing(model: str) -> ShoalError:
    """Asked for, and the model's response has no `logprobs` output: an error, never silence."""
    return ShoalError(f"model '{model}' sent no 'logprobs' output: it cannot serve 'logprobs'")


class Aligner:
    """Places each token at the character its text starts at (decoding the tokens' bytes as the
    model decodes its text) and releases it once the text shown reaches past that character."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._received = 0  # characters of the tokens' text so far
        self._pending: deque[Placed] = deque()

    def feed(self, entries: list[Entry]) -> None:
        for entry in entries:
            self._pending.append((self._received, entry))
            self._received += len(self._decoder.decode(bytes(entry["bytes"])))

    def shown(self, characters: int) -> list[Placed]:
        """The tokens whose text begins within the first `characters` characters shown."""
        released = []
        while self._pending and self._pending[0][0] < characters:
            released.append(self._pending.popleft())
        return released

    def rest(self) -> list[Placed]:
        """The stream ended without a stop sequence: every token left belongs to the text."""
        released, self._pending = list(self._pending), deque()
        return released


def chat(placed: list[Placed]) -> dict[str, Any]:
    """A chat choice's (or chunk's) `logprobs`."""
    return {"content": [entry for _, entry in placed], "refusal": None}


def completion(placed: list[Placed]) -> dict[str, Any]:
    """A legacy completion choice's (or chunk's) `logprobs`: each position's likeliest tokens as a
    dict that also holds the sampled one (OpenAI's "up to logprobs + 1" entries)."""
    tops = []
    for _, entry in placed:
        top = {t["token"]: t["logprob"] for t in entry["top_logprobs"]}
        top.setdefault(entry["token"], entry["logprob"])
        tops.append(top)
    return {
        "tokens": [entry["token"] for _, entry in placed],
        "token_logprobs": [entry["logprob"] for _, entry in placed],
        "top_logprobs": tops,
        "text_offset": [offset for offset, _ in placed],
    }

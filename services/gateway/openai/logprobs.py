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


def parse_entries(raw: bytes, model: str, prompt: bool = False) -> list[Entry]:
    """The entries of one response's `logprobs` output (`prompt`: its `prompt_logprobs` output,
    whose first entry's `logprob` is null); a model that writes something else fails the
    request, saying so."""
    output = "prompt_logprobs" if prompt else "logprobs"
    try:
        entries = orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError as exc:
        raise internal(f"model '{model}' sent a '{output}' output that is not JSON: {exc}") from None
    if not isinstance(entries, list) or not all(_is_entry(e, prompt and i == 0) for i, e in enumerate(entries)):
        raise internal(f"model '{model}' sent a '{output}' output that is not a list of token entries")
    for entry in entries:
        entry.setdefault("bytes", list(entry["token"].encode()))
        entry.setdefault("top_logprobs", [])
    return entries


def _is_entry(entry: Any, first_of_prompt: bool = False) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("token"), str)
        and (isinstance(entry.get("logprob"), (int, float)) or (first_of_prompt and entry.get("logprob") is None))
        and isinstance(entry.get("top_logprobs", []), list)
    )


def missing(model: str, output: str = "logprobs") -> ShoalError:
    """Asked for, and the model's response has no `logprobs` output: an error, never silence."""
    return ShoalError(f"model '{model}' sent no '{output}' output: it cannot serve 'logprobs'")


class Aligner:
    """Places each token at the character its text starts at (decoding the tokens' bytes as the
    model decodes its text) and releases it once the text shown reaches past that character."""

    def __init__(self, start: int = 0) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._received = start  # characters of the tokens' text so far (`start`: text before them, an echo)
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


def place_all(entries: list[Entry]) -> list[Placed]:
    """Entries of a whole text (an echoed prompt's), each at the character its text starts at."""
    aligner = Aligner()
    aligner.feed(entries)
    return aligner.rest()


def chat(placed: list[Placed]) -> dict[str, Any]:
    """A chat choice's (or chunk's) `logprobs`."""
    return {"content": [entry for _, entry in placed], "refusal": None}


def completion(placed: list[Placed]) -> dict[str, Any]:
    """A legacy completion choice's (or chunk's) `logprobs`: each position's likeliest tokens as a
    dict that also holds the sampled one (OpenAI's "up to logprobs + 1" entries)."""
    tops: list[dict[str, Any] | None] = []
    for _, entry in placed:
        if entry["logprob"] is None:  # a prompt's first token: nothing scored it (OpenAI's null)
            tops.append(None)
            continue
        top = {t["token"]: t["logprob"] for t in entry["top_logprobs"]}
        top.setdefault(entry["token"], entry["logprob"])
        tops.append(top)
    return {
        "tokens": [entry["token"] for _, entry in placed],
        "token_logprobs": [entry["logprob"] for _, entry in placed],
        "top_logprobs": tops,
        "text_offset": [offset for offset, _ in placed],
    }

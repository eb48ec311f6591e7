"""The log probabilities' shapes, and their alignment with the text the client is shown
(services/gateway/openai/logprobs.py)."""

from __future__ import annotations

import orjson
import pytest

from services.gateway.openai import logprobs
from services.gateway.openai.logprobs import Aligner
from shared.errors import ShoalError


def entry(token: str | bytes, logprob: float, top: list[tuple[str, float]] = ()) -> dict:
    raw = token if isinstance(token, bytes) else token.encode()
    return {
        "token": raw.decode("utf-8", "replace"),
        "bytes": list(raw),
        "logprob": logprob,
        "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": lp} for t, lp in top],
    }


def test_tokens_are_placed_at_the_character_their_text_starts():
    aligner = Aligner()
    # "é" is two bytes split over two tokens: the second token's text starts where the first's does
    aligner.feed([entry("a", -0.1), entry(b"\xc3", -0.2), entry(b"\xa9", -0.3), entry("b", -0.4)])
    assert [offset for offset, _ in aligner.shown(2)] == [0, 1, 1]  # "aé" shown
    assert [offset for offset, _ in aligner.rest()] == [2]


def test_a_token_waits_while_its_text_is_held_back_and_is_dropped_after_a_stop():
    aligner = Aligner()
    aligner.feed([entry("one", -1.0), entry(" two", -2.0)])
    assert [e["token"] for _, e in aligner.shown(2)] == ["one"]  # its text has begun to show
    assert aligner.shown(3) == []  # " two" starts at 3: held back with its text
    aligner.feed([entry(" STOP", -3.0)])
    assert [e["token"] for _, e in aligner.shown(7)] == [" two"]  # cut before " STOP" (at 7)


def test_completion_shape_keeps_the_sampled_token_among_the_top():
    placed = [(0, entry("Paris", -0.5, [("London", -0.4)])), (5, entry("!", -0.1, [("!", -0.1)]))]
    assert logprobs.completion(placed) == {
        "tokens": ["Paris", "!"],
        "token_logprobs": [-0.5, -0.1],
        "top_logprobs": [{"London": -0.4, "Paris": -0.5}, {"!": -0.1}],
        "text_offset": [0, 5],
    }
    assert logprobs.chat(placed)["content"][0]["top_logprobs"][0]["token"] == "London"


def test_model_entries_are_checked_and_completed():
    [parsed] = logprobs.parse_entries(orjson.dumps([{"token": "hi", "logprob": -1}]), "m")
    assert parsed == {"token": "hi", "logprob": -1, "bytes": [104, 105], "top_logprobs": []}
    assert logprobs.parse_entries(b"", "m") == []
    for bad in (b"{", b'{"token": "x"}', b'[{"token": 1, "logprob": 0}]'):
        with pytest.raises(ShoalError, match="'logprobs' output"):
            logprobs.parse_entries(bad, "m")


def test_a_prompts_entries_start_with_a_null_and_its_generated_offsets_follow_the_echo():
    raw = orjson.dumps([{"token": "One", "logprob": None}, entry(",", -2.0, [(",", -2.0)])])
    first, second = logprobs.parse_entries(raw, "m", prompt=True)
    assert first["logprob"] is None and second["logprob"] == -2.0
    for bad in (raw, orjson.dumps([entry("One", -1.0), {"token": ",", "logprob": None}])):
        with pytest.raises(ShoalError, match="'logprobs' output"):  # null: only a prompt's first
            logprobs.parse_entries(bad, "m")
    with pytest.raises(ShoalError, match="'prompt_logprobs' output"):
        logprobs.parse_entries(orjson.dumps([entry("One", -1.0), {"token": ",", "logprob": None}]), "m", prompt=True)
    echoed = logprobs.place_all([first, second])
    assert [offset for offset, _ in echoed] == [0, 3]
    aligner = Aligner(start=4)  # the generated text comes after the echoed "One,"
    aligner.feed([entry(" two", -0.5)])
    generated = aligner.shown(4 + 4)
    assert logprobs.completion(echoed + generated) == {
        "tokens": ["One", ",", " two"],
        "token_logprobs": [None, -2.0, -0.5],
        "top_logprobs": [None, {",": -2.0}, {" two": -0.5}],
        "text_offset": [0, 3, 4],
    }

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.openai.stops import StopScanner

text = st.text(alphabet="abc\n", max_size=30)


def _run(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    scanner = StopScanner(stops)
    shown = "".join(scanner.feed(p) for p in pieces) + scanner.flush()
    return shown, scanner.stopped


def test_a_stop_split_over_pieces_is_found_and_not_shown():
    assert _run(["Hello wor", "ld\nUs", "er: more"], ["\nUser:"]) == ("Hello world", True)


def test_held_back_text_is_released_when_it_cannot_start_a_stop():
    scanner = StopScanner(["END"])
    assert scanner.feed("abcE") == "abc"
    assert scanner.feed("x") == "Ex"
    assert scanner.flush() == ""


@given(st.lists(text, max_size=8), st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), max_size=3))
def test_pieces_show_the_text_up_to_the_first_stop(pieces: list[str], stops: list[str]):
    whole = "".join(pieces)
    ends = [(end, end - len(s)) for end in range(len(whole) + 1) for s in stops if whole[:end].endswith(s)]
    expected = whole[: min(ends)[1]] if ends else whole
    assert _run(pieces, stops) == (expected, bool(ends))


def test_the_stop_that_ends_first_wins_whatever_the_pieces():
    assert _run(["ab", "c"], ["abc", "b"]) == ("a", True)
    assert _run(["abc"], ["abc", "b"]) == ("a", True)

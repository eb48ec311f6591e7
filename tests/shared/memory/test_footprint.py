"""Memory budgets and measurements (shared/memory/footprint.py)."""

from __future__ import annotations

import mmap

import pytest

from shared.memory.footprint import parse_budget, proportional_bytes, rss_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("0", 0), ("1024", 1024), ("2K", 2048), ("1.5G", 3 << 29), ("512MB", 512 << 20), ("25%", 250)],
)
def test_budgets_in_bytes_or_a_share_of_ram(text: str, expected: int) -> None:
    assert parse_budget(text, ram=1000) == expected


@pytest.mark.parametrize("text", ["lots", "-1G", "150%", "G"])
def test_a_bad_budget_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="invalid memory budget"):
        parse_budget(text, ram=1000)


def test_the_resident_set_grows_with_an_allocation() -> None:
    # fresh pages from the kernel: a bytearray in a long test run can reuse memory malloc kept
    # resident after earlier tests freed it, and then the resident set does not move
    before = rss_bytes()
    with mmap.mmap(-1, 64 << 20) as block:
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        assert rss_bytes() - before >= 32 << 20


def test_the_proportional_set_is_at_most_the_resident_set_and_grows_too() -> None:
    before = proportional_bytes()
    assert 0 < before <= rss_bytes()
    with mmap.mmap(-1, 64 << 20) as block:
        for offset in range(0, len(block), mmap.PAGESIZE):
            block[offset] = 1
        assert proportional_bytes() - before >= 60 << 20

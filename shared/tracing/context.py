"""W3C trace context (https://www.w3.org/TR/trace-context/): `traceparent` read and written.

A sampled request carries its parent span's `traceparent` (and `tracestate`) in its wire Struct
(`InferRequest.traceparent`): one bus message carries many requests of different traces, so the
context travels per request, not as one header of the message.
"""

from __future__ import annotations

from typing import NamedTuple

_HEX = frozenset("0123456789abcdef")


class SpanRef(NamedTuple):
    """A span as W3C trace context names it."""

    trace_id: int
    span_id: int
    flags: int


def parse(traceparent: str) -> SpanRef | None:
    """A valid `traceparent` header's ids, or None (as a propagator ignores an invalid one)."""
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or [len(p) for p in parts[:4]] != [2, 32, 16, 2]:
        return None
    version, trace_id, span_id, flags = parts[:4]
    if not all(set(p) <= _HEX for p in parts[:4]) or version == "ff" or (version == "00" and len(parts) != 4):
        return None
    ref = SpanRef(int(trace_id, 16), int(span_id, 16), int(flags, 16))
    return ref if ref.trace_id and ref.span_id else None


def format(ref: SpanRef) -> str:
    return f"00-{ref.trace_id:032x}-{ref.span_id:016x}-{ref.flags:02x}"

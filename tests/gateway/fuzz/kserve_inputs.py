"""Hypothesis strategies for what a client may send the HTTP front door: KServe v2 JSON bodies
(valid-ish and broken), Triton's binary tensor extension, header sets, and shared-memory
registrations. Shared by the CI slice (tests/gateway/fuzz/) and benchmarks/fuzz_front_doors.py."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from shared.config.datatypes import DATATYPES

MODELS = ("simple", "identity_fp32", "identity_bytes", "mlp", "no_such_model")
HUGE = (2**31, 2**32, 2**53, 2**63 - 1, 2**63, 2**64, -(2**63), -1)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
dims = st.integers(-2, 20) | st.sampled_from(HUGE)
shapes = st.one_of(st.lists(dims, max_size=5), st.just([1, 16]), st.just([16]), junk)
datatypes = st.one_of(st.sampled_from(sorted(DATATYPES)), st.text(max_size=6), junk)
numbers = st.integers(-(2**65), 2**65) | st.floats() | st.booleans() | st.text(max_size=4)
values = st.one_of(
    st.lists(numbers, max_size=40),
    st.lists(st.lists(numbers, max_size=8), max_size=4),
    st.lists(st.integers(-5, 5), min_size=16, max_size=16),
    junk,
)
parameters = st.dictionaries(
    st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"])
    | st.text(max_size=8),
    junk | st.integers(-(2**64), 2**64),
    max_size=3,
)


@st.composite
def tensors(draw: st.DrawFn) -> dict[str, Any]:
    tensor: dict[str, Any] = {}
    for key, strategy in (
        ("name", st.sampled_from(["INPUT0", "INPUT1", "OUTPUT0"]) | st.text(max_size=8) | junk),
        ("datatype", datatypes),
        ("shape", shapes),
        ("data", values),
        ("parameters", parameters),
    ):
        if draw(st.integers(0, 5)):  # each field is there most of the time
            tensor[key] = draw(strategy)
    return tensor


def valid_simple() -> dict[str, Any]:
    data = list(range(16))
    return {
        "id": "fuzz",
        "inputs": [{"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "data": data} for i in (0, 1)],
        "outputs": [{"name": "OUTPUT0"}],
    }


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """A request document: a valid one with one field changed, one made of fuzzed tensors, or junk."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        doc = valid_simple()
        where = draw(st.sampled_from(["id", "inputs", "outputs", "parameters", "tensor"]))
        if where == "tensor":
            doc["inputs"][draw(st.integers(0, 1))] = draw(tensors())
        else:
            doc[where] = draw(junk | st.lists(tensors(), max_size=3))
        return doc
    if kind == 1:
        doc = {"inputs": draw(st.lists(tensors(), max_size=3))}
        if draw(st.booleans()):
            doc["outputs"] = draw(st.lists(tensors() | junk, max_size=2))
        if draw(st.booleans()):
            doc["parameters"] = draw(junk)
        return doc
    return draw(junk)


def encode(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


@st.composite
def json_bodies(draw: st.DrawFn) -> bytes:
    """A body: a document as JSON, or its bytes broken (cut, spliced with non-UTF-8, nested deep)."""
    body = encode(draw(documents()))
    how = draw(st.integers(0, 5))
    if how == 1 and body:
        return body[: draw(st.integers(0, len(body) - 1))]
    if how == 2:
        at = draw(st.integers(0, len(body)))
        return body[:at] + draw(st.binary(min_size=1, max_size=8)) + body[at:]
    if how == 3:
        depth = draw(st.integers(90, 3000))
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        closer = b"]" if opener == b"[" else b"}"
        return opener * depth + b"1" + closer * draw(st.integers(0, depth))
    if how == 4:
        return body.replace(b'"fuzz"', b'"\xff\xfe\xc3("', 1).replace(b"INPUT0", b"INPUT\xe9", 1)
    return body


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A binary-extension body and its headers: declared sizes, header lengths and data that
    agree, or do not (too long, too short, negative, not a number)."""
    sizes = [draw(st.sampled_from([64, 0, 63, 65, 2**31]) | st.integers(-3, 200)) for _ in range(2)]
    doc = valid_simple()
    for tensor, size in zip(doc["inputs"], sizes):
        del tensor["data"]
        tensor["parameters"] = {"binary_data_size": size}
    if draw(st.booleans()):
        doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": draw(junk)}}]
    header = encode(doc)
    data = draw(st.binary(max_size=300))
    body = header + data
    declared: bytes = draw(
        st.sampled_from([str(len(header)).encode(), b"0", b"-1", b"abc", b"", str(len(body) + 1).encode()])
        | st.integers(-(2**64), 2**64).map(lambda n: str(n).encode())
    )
    extra: list[tuple[bytes, bytes]] = [(b"inference-header-content-length", declared)]
    if draw(st.booleans()):
        extra.append((b"content-encoding", draw(st.sampled_from([b"gzip", b"deflate", b"br", b"identity", b"\xff"]))))
    return body, extra


header_names = st.sampled_from(
    [b"content-encoding", b"accept-encoding", b"inference-header-content-length", b"traceparent", b"x-junk"]
) | st.binary(min_size=1, max_size=12).filter(lambda b: all(32 < c < 127 and c != ord(":") for c in b))
header_values = st.binary(max_size=64).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")) | st.sampled_from(
    [b"gzip", b"deflate", b"gzip;q=abc, deflate;q=-1", b"0", b"99999999999999999999", b"\xff\xfe"]
)
header_sets = st.lists(st.tuples(header_names, header_values), max_size=12)


@st.composite
def registrations(draw: st.DrawFn) -> tuple[str, bytes]:
    """A system shared-memory region name and its registration body."""
    name = draw(st.text(st.characters(codec="utf-8", exclude_characters="/?#%"), min_size=1, max_size=16))
    doc: dict[str, Any] = {}
    for key, strategy in (
        ("key", st.sampled_from(["/fuzz_missing", "", "/", "../etc/passwd", "/shoal-host-id"]) | junk),
        ("offset", st.integers(-(2**64), 2**65) | junk),
        ("byte_size", st.integers(-(2**64), 2**65) | junk),
    ):
        if draw(st.integers(0, 4)):
            doc[key] = draw(strategy)
    return name, encode(doc) if draw(st.integers(0, 5)) else draw(st.binary(max_size=40))

"""The int64 limits a front end checks while it parses a request, before it reads any tensor
data: Triton keeps element counts and byte sizes in int64, and its HTTP and gRPC front ends refuse
a shape that overflows them with these texts (http_server.cc; docs/compatibility.md). Checks
against the model (datatype, shape, byte size) are the inference core's, once
(inference/validation.py)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.errors import invalid

INT64_MAX = 2**63 - 1

# Sequence, not list: gRPC hands a protobuf repeated field, which a compiled function typed `list`
# refuses ("list object expected; got RepeatedScalarContainer", the compiled build's gRPC path)


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_shape(name: str, shape: Sequence[int]) -> None:
    """A shape whose element count (or a dim) overflows int64 is a 400 (GetElementCount's -3)."""
    count = 1
    for dim in shape:
        count *= dim
        if dim > INT64_MAX or count > INT64_MAX:
            raise invalid(
                f"invalid shape for input '{name}': shape {_fmt(shape)} causes total element count "
                f"to exceed maximum size of {INT64_MAX}"
            )


def check_json_byte_size(name: str, datatype: str, shape: Sequence[int], size: int) -> None:
    """A JSON `data` input's element count times its datatype's size must fit int64 too: Triton
    checks it before reading the values (`http_server.cc`, qa/L0_http `test_overflow`)."""
    count = 1
    for dim in shape:
        count *= dim
    if size > 1 and count > INT64_MAX // size:
        raise invalid(
            f"byte size overflow for input '{name}': element count ({count}) * data type size ({size}) "
            f"exceeds maximum allowed size ({INT64_MAX})"
        )

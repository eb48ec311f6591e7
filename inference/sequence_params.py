"""The sequence extension's request parameters (docs/triton-spec.md §1.7.2), read once at the gateway.

They become typed `InferRequest` fields (and so `RequestHeader` fields) because the
scheduler routes sequence requests on them and must not decode `parameters` to do so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.errors import invalid

_UINT64_MAX = 2**64 - 1


@dataclass(frozen=True)
class SequenceParams:
    sequence_id: int | str = 0  # 0 / "" = not in a sequence
    start: bool = False
    end: bool = False


_NONE = SequenceParams()


def sequence_params(parameters: dict[str, Any]) -> SequenceParams:
    """Triton parses `sequence_id` as an unsigned integer first, a string second."""
    if not parameters:  # most requests carry none
        return _NONE
    corrid = parameters.get("sequence_id", 0)
    if (
        isinstance(corrid, bool)
        or not isinstance(corrid, (int, str))
        or (isinstance(corrid, int) and not 0 <= corrid <= _UINT64_MAX)
    ):
        raise invalid("Unable to parse 'sequence_id': attempt to access JSON non-unsigned-integer as unsigned-integer")
    flags = []
    for key in ("sequence_start", "sequence_end"):
        value = parameters.get(key, False)
        if not isinstance(value, bool):
            raise invalid(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
        flags.append(value)
    return SequenceParams(corrid, flags[0], flags[1])

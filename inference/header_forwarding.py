"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern`: request headers whose name
matches become string parameters of the inference request (Triton's extension_parameters.md).

As tritonserver: the pattern is searched for in the header's name (RE2's PartialMatch), without
regard to case unless it starts with `(?-i)` (tritonserver prefixes `(?i)` to what it is given);
a matching header named like a reserved parameter, or starting `triton_`, fails the request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from shared.errors import invalid

# core's kReservedParameterKeys (src/common.h)
RESERVED = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"}
)
_CASE_SENSITIVE = "(?-i)"


class HeaderForwarder:
    def __init__(self, pattern: str) -> None:
        if pattern.startswith(_CASE_SENSITIVE):  # Python's re has no bare (?-i): the flag is left off instead
            self.regex = re.compile(pattern[len(_CASE_SENSITIVE) :])
        else:
            self.regex = re.compile(pattern, re.IGNORECASE)

    def forward(self, headers: Iterable[tuple[str, str]], parameters: dict[str, Any]) -> None:
        """Add each matching header to `parameters` (Triton's text for a reserved one)."""
        search = self.regex.search
        for name, value in headers:
            if search(name) is None:
                continue
            if name in RESERVED or name.startswith("triton_"):
                raise invalid(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            parameters[name] = value


def forwarder(pattern: str) -> HeaderForwarder | None:
    """None when no pattern is set: nothing is looked at on the hot path."""
    return HeaderForwarder(pattern) if pattern else None

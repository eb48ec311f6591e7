"""What a request and its answer are, whatever the transport: parsed inputs, requested outputs,
output tensors. HTTP's JSON/binary codec, gRPC's protobuf and BLS all build and read these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from inference.otel_trace import Carrier
from shared.config.datatypes import element_count, element_size


class TraceFrom(NamedTuple):
    """Where a request came from for its trace: the transport ("HTTP", "GRPC"; "" for a BLS
    call) and the W3C context it brought (the client's headers, or the calling request's span)."""

    protocol: str
    parent: Carrier | None = None


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: memoryview | bytes | None  # raw wire bytes (BYTES: length-prefixed); None: in shared memory
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def in_shared_memory(self) -> bool:
        return self.data is None


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # None = not stated
    classification: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def in_shared_memory(self) -> bool:
        return "shared_memory_region" in self.parameters


@dataclass
class ParsedRequest:
    id: str
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None  # None = all outputs
    parameters: dict[str, Any]
    # the prompt's prefix blocks for the scheduler's prefix-aware routing (OpenAI front end); off the tensors
    route: list[int] = field(default_factory=list)

    @property
    def binary_data_output(self) -> bool:
        return bool(self.parameters.get("binary_data_output", False))


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: memoryview | bytes | None  # raw wire bytes; None: written into the client's shared memory
    binary: bool


@dataclass
class Answer:
    """One response of a model to a request, whatever carries it back."""

    model: str
    version: int
    id: str
    outputs: list[OutputTensor]
    parameters: dict[str, Any] = field(default_factory=dict)
    final: bool = True  # decoupled models: the last response of this request


def expected_byte_size(datatype: str, shape: list[int], data: memoryview | bytes) -> tuple[int, int]:
    """(expected, actual) byte sizes; BYTES is checked by walking its length prefixes."""
    actual = memoryview(data).nbytes
    if datatype != "BYTES":
        return element_count(shape) * element_size(datatype), actual
    return actual if _bytes_elements(data) == element_count(shape) else -1, actual


def _bytes_elements(data: memoryview | bytes) -> int:
    view = memoryview(data).cast("B")
    count = offset = 0
    while offset + 4 <= len(view):
        offset += 4 + int.from_bytes(view[offset : offset + 4], "little")
        count += 1
    return count if offset == len(view) else -1

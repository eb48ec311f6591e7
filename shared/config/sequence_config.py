"""`sequence_batching` of a model config (docs/triton-spec.md §2.2), as one frozen view.

Read from the normalized config JSON by both the scheduler (strategy, slots, idle
timeout) and the worker (control inputs, implicit state), so neither parses it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.config.datatypes import config_to_protocol

START, READY, END, CORRID = (
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_READY",
    "CONTROL_SEQUENCE_END",
    "CONTROL_SEQUENCE_CORRID",
)


@dataclass(frozen=True)
class Control:
    """One control input: which flag it carries and in which datatype / values."""

    input_name: str
    kind: str
    datatype: str  # protocol name: INT32, FP32, BOOL; CORRID: UINT64, INT64, UINT32, INT32, BYTES
    false_true: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True)
class InitialState:
    datatype: str
    dims: tuple[int, ...]
    zero_data: bool = True
    data_file: str = ""


@dataclass(frozen=True)
class State:
    """An implicit state: `output_name` of request i is fed as `input_name` of request i+1."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial: InitialState | None = None


@dataclass(frozen=True)
class SequenceConfig:
    strategy: str  # "direct" or "oldest"
    max_batch_size: int
    idle_us: int
    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0  # direct
    max_candidate_sequences: int = 0  # oldest
    preferred_batch_sizes: tuple[int, ...] = ()  # oldest
    controls: tuple[Control, ...] = ()
    states: tuple[State, ...] = ()
    # `iterative_sequence: true`: a request without a correlation ID starts a sequence of its own,
    # which lasts while the model reschedules it (core's IterativeSequencer)
    iterative: bool = False

    @property
    def slots_per_instance(self) -> int:
        """Triton: `max(1, max_batch_size)` batch slots (direct), `max_candidate_sequences` (oldest)."""
        if self.strategy == "oldest":
            return max(1, self.max_candidate_sequences)
        return max(1, self.max_batch_size)

    def control(self, kind: str) -> Control | None:
        return next((c for c in self.controls if c.kind == kind), None)


def _control(name: str, doc: dict[str, Any]) -> Control:
    kind = doc.get("kind", START)
    if kind == CORRID:
        return Control(name, kind, config_to_protocol(doc.get("data_type", "TYPE_UINT64")), (0, 0))
    for key, datatype in (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"), ("bool_false_true", "BOOL")):
        values = doc.get(key) or []
        if len(values) == 2:
            return Control(name, kind, datatype, (values[0], values[1]))
    return Control(name, kind, "INT32", (0, 1))


def _state(doc: dict[str, Any]) -> State:
    initial = None
    for init in doc.get("initial_state", [])[:1]:
        initial = InitialState(
            datatype=config_to_protocol(init.get("data_type", doc.get("data_type", "TYPE_FP32"))),
            dims=tuple(int(d) for d in init.get("dims", [])),
            zero_data=bool(init.get("zero_data", False)) or not init.get("data_file"),
            data_file=init.get("data_file", ""),
        )
    return State(
        input_name=doc["input_name"],
        output_name=doc["output_name"],
        datatype=config_to_protocol(doc.get("data_type", "TYPE_FP32")),
        dims=tuple(int(d) for d in doc.get("dims", [])),
        initial=initial,
    )


def sequence_config(config: dict[str, Any]) -> SequenceConfig | None:
    """None when the model does not use the sequence batcher."""
    doc = config.get("sequence_batching")
    if doc is None:
        return None
    oldest = doc.get("oldest")
    strategy = doc.get("direct") if oldest is None else oldest
    strategy = strategy or {}
    return SequenceConfig(
        strategy="oldest" if oldest is not None else "direct",
        max_batch_size=int(config.get("max_batch_size", 0)),
        idle_us=int(doc.get("max_sequence_idle_microseconds", 0)) or 1_000_000,
        max_queue_delay_us=int(strategy.get("max_queue_delay_microseconds", 0)),
        minimum_slot_utilization=float(strategy.get("minimum_slot_utilization", 0.0)),
        max_candidate_sequences=int(strategy.get("max_candidate_sequences", 0)),
        preferred_batch_sizes=tuple(sorted(int(s) for s in strategy.get("preferred_batch_size", []))),
        controls=tuple(_control(ci["name"], c) for ci in doc.get("control_input", []) for c in ci.get("control", [])),
        states=tuple(_state(s) for s in doc.get("state", [])),
        iterative=bool(doc.get("iterative_sequence", False)),
    )

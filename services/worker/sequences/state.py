"""Implicit state of sequence models (`sequence_batching { state [...] }`, docs/triton-spec.md §2.2).

The state lives in the worker because a sequence is pinned to one instance of one worker
from START to END: request i's `output_name` tensor is fed as `input_name` of request i+1.
It is keyed by (correlation id, the scheduler's sequence number), so a correlation id that
is reused for a new sequence never sees an old sequence's state, whatever order a late
`SequenceEnded` arrives in. START resets it to the initial state (zeros or `data_file`,
read from `<version>/initial_state/`), END and `SequenceEnded` (idle timeout, cancel) drop it.
A sequence's requests run one at a time (the scheduler guarantees it), so no lock is needed
beyond the event loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.config.datatypes import numpy_dtype
from shared.config.paths import inside
from shared.config.sequence_config import SequenceConfig, State
from shared.wire.messages import SeqControl

Key = tuple[int | str, int]


def initial_value(state: State, batched: bool, state_dir: Path | None) -> np.ndarray:
    init = state.initial
    dims = init.dims if init is not None and init.dims else tuple(1 if d == -1 else d for d in state.dims)
    dtype = numpy_dtype(state.datatype)
    if init is not None and not init.zero_data and state_dir is not None:
        array = np.fromfile(inside(state_dir, init.data_file), dtype=dtype).reshape(dims)
    else:
        array = np.zeros(dims, dtype=dtype)
    return array.reshape((1, *dims)) if batched else array


class StateStore:
    def __init__(self, config: SequenceConfig, state_dir: Path | None) -> None:
        self.states = config.states
        self.batched = config.max_batch_size > 0
        self.state_dir = state_dir
        self._held: dict[Key, dict[str, np.ndarray]] = {}
        self._slots: dict[tuple[int, int], Key] = {}  # (instance, slot) -> the sequence last started there

    @property
    def output_names(self) -> list[str]:
        return [s.output_name for s in self.states]

    def initial(self) -> dict[str, np.ndarray]:
        return {s.input_name: initial_value(s, self.batched, self.state_dir) for s in self.states}

    def inputs(self, seq: SeqControl, instance: int = 0) -> dict[str, np.ndarray]:
        if not self.states:
            return {}
        key = (seq.corrid, seq.seq)
        if seq.start:  # whatever sequence held this slot before is over, whether or not we were told
            previous = self._slots.get((instance, seq.slot))
            if previous is not None and previous != key:
                self._held.pop(previous, None)
            self._slots[(instance, seq.slot)] = key
        held = None if seq.start else self._held.get(key)
        if held is None:
            held = self.initial()
        return dict(held)

    def keep(self, seq: SeqControl, outputs: dict[str, np.ndarray]) -> None:
        """Take the state outputs out of a request's outputs (clients never see them)."""
        if not self.states:
            return
        new = {s.input_name: outputs.pop(s.output_name) for s in self.states if s.output_name in outputs}
        if seq.end:
            self._held.pop((seq.corrid, seq.seq), None)
        elif new:
            self._held[(seq.corrid, seq.seq)] = {k: np.array(v, copy=True) for k, v in new.items()}

    def drop(self, corrid: int | str, seq: int) -> None:
        self._held.pop((corrid, seq), None)

    def __len__(self) -> int:
        return len(self._held)

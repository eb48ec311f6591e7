"""Which discipline serves a model version's queue (`batching/discipline.py`), from its config:
the sequence batcher for a `sequence_batching` model, else the dynamic batcher (which is also
Triton's default scheduler). The pump asks when it creates a queue and when a reload's config
is one the current discipline cannot serve (`Pump.configure`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from services.scheduler.batching.discipline import Host
from services.scheduler.batching.dynamic import DynamicBatcher
from services.scheduler.batching.model_queue import Discipline
from services.scheduler.scheduling_records import Key
from services.scheduler.sequences.sequence_batcher import SequenceBatcher
from shared.config.model_config import ModelSpec
from shared.config.sequence_config import sequence_config

Publish = Callable[[str, bytes], Awaitable[None]]


class DisciplineFactory:
    def __init__(self, publish: Publish) -> None:
        self.publish = publish  # the sequence batcher answers and tells workers itself

    def choose(self, key: Key, spec: ModelSpec | None, host: Host) -> Discipline:
        config = sequence_config(spec.config) if spec is not None else None
        if config is None:
            return DynamicBatcher(host, spec)
        return SequenceBatcher(host, self.publish, key[0], config)

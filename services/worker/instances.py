"""A worker's loaded model versions and their instances."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shared.model_config import ModelSpec


@dataclass
class Instance:
    index: int
    runner: Any  # the backend's instance: run(inputs, output_names), close()
    executor: ThreadPoolExecutor  # one thread: the instance's own
    credits: int
    idle: set[int] = field(default_factory=set)  # credits not held by a batch
    uncredited: int = 0  # batches running outside the credits (sent to a retired generation)
    closed: bool = False

    def __post_init__(self) -> None:
        self.idle = set(range(self.credits))

    @property
    def busy(self) -> bool:
        return len(self.idle) < self.credits or self.uncredited > 0

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.executor.shutdown(wait=False)
            self.runner.close()


@dataclass
class LoadedModel:
    spec: ModelSpec
    version: int
    generation: int
    instances: list[Instance] = field(default_factory=list)
    retired: bool = False
    warmup_ms: float = 0.0
    sequence: Any = None  # SequenceConfig of a sequence-batched model
    states: Any = None  # its implicit-state StateStore

    def retire(self) -> None:
        """No more credits; each instance closes once its running batches end."""
        self.retired = True
        for instance in self.instances:
            if not instance.busy:
                instance.close()

    def close(self) -> None:
        for instance in self.instances:
            instance.close()

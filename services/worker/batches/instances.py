"""A worker's loaded model versions and their instances."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from services.worker.backends.runner import Runner
from services.worker.batches.instance_thread import InstanceThread
from services.worker.sequences.state import StateStore
from shared.config.model_config import ModelSpec
from shared.config.sequence_config import SequenceConfig

log = logging.getLogger("shoal.worker")


def _close_quietly(runner: Runner, name: str, lock: threading.Lock) -> None:
    try:
        with lock:  # after a batch the hot loop runs
            runner.close()
    except Exception:
        log.exception("closing instance %s failed", name)


@dataclass
class Instance:
    index: int
    runner: Runner
    executor: InstanceThread  # one thread: the instance's own
    credits: int
    idle: set[int] = field(default_factory=set)  # credits not held by a batch
    uncredited: int = 0  # batches running outside the credits (sent to a retired generation)
    closed: bool = False
    name: str = ""  # Triton's instance name (`<group>` or `<group>_<c>`)
    kind: str = "KIND_CPU"
    device: int = 0  # CUDA device of a KIND_GPU instance
    executions: int = 0  # batches run: shows which instances of which groups serve
    # held while the model runs a batch: the instance's thread and the hot loop's take turns
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.idle = set(range(self.credits))

    @property
    def busy(self) -> bool:
        return len(self.idle) < self.credits or self.uncredited > 0

    def close(self) -> None:
        """Close the backend instance on its own thread, after the batches queued there: model
        code (a python model's `finalize`, which may wait on its threads or make BLS calls)
        must never run on the worker's event loop."""
        if not self.closed:
            self.closed = True
            self.executor.submit(_close_quietly, self.runner, self.name, self.lock)
            self.executor.shutdown(wait=False)


@dataclass
class LoadedModel:
    spec: ModelSpec
    version: int
    generation: int
    instances: list[Instance] = field(default_factory=list)
    retired: bool = False
    draining: bool = False  # the worker is stopping: its completions give no credit back (service.drain)
    warmup_ms: float = 0.0
    load_s: float = 0.0  # its (successful) load took, warmup included: Triton's nv_model_load_duration_secs
    rss_bytes: int = 0  # memory its instances took at load (shared/memory/footprint.py)
    device_bytes: int = 0
    sequence: SequenceConfig | None = None  # of a sequence-batched model
    states: StateStore | None = None  # its implicit state

    def retire(self) -> None:
        """No more credits; each instance closes once its running batches end."""
        self.retired = True
        for instance in self.instances:
            if not instance.busy:
                instance.close()

    def close(self) -> None:
        for instance in self.instances:
            instance.close()

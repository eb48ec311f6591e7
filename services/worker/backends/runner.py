"""What the worker asks of a model instance, whatever its backend: the `Runner` protocol.

A backend turns a model version into instances that each implement `Runner`. The worker hands
an instance a `Batch` (one `Work` per request: its tensors, the outputs it asked for and what a
model may ask of a request besides its tensors) and gets one `Result` per request back. Tensor
backends (onnxruntime, PyTorch, TensorRT) run the batch as one call on gathered inputs
(`BatchedRunner`); request-level backends (Triton's python backend, in-process Python functions)
see the requests one by one and may stream a request's responses themselves.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from services.worker.backends import batch_inputs
from services.worker.backends.gather_scatter import gather, scatter
from shared.config.model_config import ModelSpec
from shared.errors import Code

Tensors = dict[str, np.ndarray]
CorrelationId = int | str


class Answer(dict[str, np.ndarray]):
    """A request's outputs with its response's parameters (a backend's
    `TRITONBACKEND_ResponseSet*Parameter`): Tensors wherever Tensors go."""

    def __init__(self, outputs: Tensors, parameters: dict[str, object]) -> None:
        super().__init__(outputs)
        self.parameters = parameters


class ModelError(Exception):
    """A request the model answered with an error (or failed by raising)."""

    def __init__(self, message: str, code: Code) -> None:
        super().__init__(message)
        self.message, self.code = message, code


class Streamed:
    """The result of a request whose responses the model sends itself (decoupled)."""

    def __repr__(self) -> str:
        return "STREAMED"


STREAMED = Streamed()


class Rescheduled:
    """The result of a request the model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
    no answer now; it goes back to its sequence's queue to run again (iterative sequences)."""

    def __repr__(self) -> str:
        return "RESCHEDULED"


RESCHEDULED = Rescheduled()
Result = Tensors | ModelError | Streamed | Rescheduled


@dataclass
class Piece:
    """One response of a decoupled request: outputs or an error, or neither (a bare final flag)."""

    outputs: Tensors | None = None
    error: ModelError | None = None
    parameters: dict[str, object] = field(default_factory=dict)
    final: bool = False


class ResponseStream(Protocol):
    """Where a decoupled request's responses go, from any thread, as the model sends them."""

    @property
    def closed(self) -> bool: ...

    def send(self, piece: Piece) -> None: ...


class Unheard:
    """The response stream of a decoupled request nobody listens to (a warmup request's)."""

    closed = False

    def send(self, piece: Piece) -> None:
        pass


def _never() -> bool:
    return False


@dataclass
class RequestContext:
    """What a model can ask of a request besides its tensors (Triton's request accessors)."""

    request_id: str = ""
    correlation_id: CorrelationId = 0
    flags: int = 0
    parameters: dict[str, object] = field(default_factory=dict)
    timeout_us: int = 0
    cancelled: Callable[[], bool] = _never
    responses: ResponseStream | None = None  # set for a decoupled model's requests
    trace: tuple[str, str] | None = None  # OpenTelemetry: (traceparent, tracestate) of the request's span


@dataclass
class Work:
    """One request as a backend sees it."""

    inputs: Tensors
    outputs: list[str]  # the outputs asked for
    batch_size: int = 1
    context: RequestContext = field(default_factory=RequestContext)


@dataclass
class Batch:
    work: list[Work]
    deadline_ns: int = 0  # the earliest deadline of its requests (BLS calls inherit it); 0: none
    extra_outputs: list[str] = field(default_factory=list)  # outputs a batched run must produce too (state)
    inputs_done_ns: int = 0  # monotonic time the runner had its inputs ready (statistics: input vs infer)

    def inputs_ready(self) -> None:
        self.inputs_done_ns = time.monotonic_ns()


class Runner(Protocol):
    """One model instance. Its methods run on the instance's own thread, never on the event loop."""

    @property
    def batches_rows(self) -> bool:
        """True when requests become rows of one batched call (the direct sequence strategy then
        places each request in its slot's row); False when the model sees requests one by one."""
        ...

    @property
    def checks_readiness(self) -> bool:
        """True when the model has its own readiness check (a python model's `is_ready`), which
        model readiness requests consult (services/worker/readiness.py)."""
        ...

    def execute(self, batch: Batch) -> list[Result]:
        """One result per request of the batch, in order; raises only for a failure of the whole batch."""
        ...

    def readiness(self) -> tuple[bool, str]:
        """The model's own readiness check: ready, or not and why (may block; never raises)."""
        ...

    def sequence_ended(self, correlation_id: CorrelationId, reason: str) -> None:
        """A sequence ended without its END request (idle timeout, cancelled)."""
        ...

    def close(self) -> None: ...


class BatchedRunner:
    """A tensor backend's instance: the batch's inputs gathered, one `run`, the outputs scattered."""

    batches_rows = True
    checks_readiness = False

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.batch_inputs = batch_inputs.parse(spec.config)  # a bad one fails the load, as in Triton

    @abstractmethod
    def run(self, inputs: Tensors, output_names: list[str]) -> Tensors: ...

    @abstractmethod
    def close(self) -> None: ...

    def execute(self, batch: Batch) -> list[Result]:
        requests = [w.inputs for w in batch.work]
        inputs = gather(self.spec, requests, self.batch_inputs)
        batch.inputs_ready()
        names = sorted({n for w in batch.work for n in w.outputs} | set(batch.extra_outputs))
        outputs = self.run(inputs, names)
        return list(scatter(self.spec, outputs, [w.batch_size for w in batch.work], requests))

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def sequence_ended(self, correlation_id: CorrelationId, reason: str) -> None:
        pass


class RequestRunner:
    """A backend that sees the requests one by one (`execute` loops over them itself), with no
    readiness check and nothing to do when a sequence ends: Triton's small C++ backends."""

    batches_rows = False
    checks_readiness = False

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def sequence_ended(self, correlation_id: CorrelationId, reason: str) -> None:
        pass

    def close(self) -> None:
        pass

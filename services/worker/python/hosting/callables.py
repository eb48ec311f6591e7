"""Python callables served by the process that registered them (`shoal.pytriton`'s `Triton.bind`).

A process that binds a function becomes a worker for that model: the scheduler sends it batches
as to any worker, and the function runs on the instance's own thread with the requests' numpy
inputs (no stub process and no copy beyond reading the tensors, as for python-backend models).
The model's config carries the parameter `IN_PROCESS`, so a worker that did not register the
callable (the cluster's own workers, other processes) never tries to host it.

A decoupled model's callable is a generator: each item it yields is one response per request,
sent at once through the request's response sender (the same path python-backend decoupled
models take); the end of the generator is the final flag.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from services.worker.backends import Placement
from services.worker.backends.runner import (
    STREAMED,
    Batch,
    CorrelationId,
    ModelError,
    Piece,
    ResponseStream,
    Result,
    Unheard,
    Work,
)
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError, internal, unavailable

IN_PROCESS = "shoal-in-process"  # config parameter: hosted only by the process that registered it

Outputs = Mapping[str, np.ndarray]


def in_process(config: Mapping[str, Any]) -> bool:
    """Whether a model's (JSON) config says it is served by a registered callable."""
    return IN_PROCESS in (config.get("parameters") or {})


@dataclass
class CallRequest:
    """One request as a callable sees it."""

    inputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)
    output_names: list[str] = field(default_factory=list)
    request_id: str = ""
    cancelled: Callable[[], bool] = lambda: False


class Handler(Protocol):
    """One instance's function: the batch's requests in, one result per request out (or, for a
    decoupled model, an iterable of such lists). Raising fails the batch's requests; a
    `ShoalError` keeps its code (INVALID_ARG becomes a 400)."""

    def __call__(self, requests: list[CallRequest]) -> Any: ...


class CallableModel(Protocol):
    """What a binding registers: how many distinct handlers it has, and each instance's."""

    def handler(self, index: int) -> Handler: ...


def model_error(exc: BaseException) -> ModelError:
    if isinstance(exc, ShoalError):
        return ModelError(exc.message, exc.code)
    return ModelError(f"{type(exc).__name__}: {exc}", Code.INTERNAL)


def _call(work: Work) -> CallRequest:
    context = work.context
    return CallRequest(
        dict(work.inputs), dict(context.parameters), list(work.outputs), context.request_id, context.cancelled
    )


class CallableInstance:
    """One instance of a bound function, as the worker's `Runner`: it sees the batch's requests
    together (PyTriton's `@batch` stacks them itself)."""

    batches_rows = False
    checks_readiness = False

    def __init__(self, spec: ModelSpec, handler: Handler, name: str) -> None:
        self.spec, self.handler, self.name = spec, handler, name

    def execute(self, batch: Batch) -> list[Result]:
        calls = [_call(work) for work in batch.work]
        batch.inputs_ready()
        if self.spec.decoupled:
            self._stream(calls, [work.context.responses or Unheard() for work in batch.work])
            return [STREAMED] * len(calls)
        try:
            results: list[Any] = list(self.handler(calls))
        except Exception as exc:  # the function raised: its requests fail, the worker goes on
            return [model_error(exc)] * len(calls)
        if len(results) != len(calls):
            error = ModelError(f"the model returned {len(results)} responses for {len(calls)} requests", Code.INTERNAL)
            return [error] * len(calls)
        return [dict(result) for result in results]

    def _stream(self, calls: list[CallRequest], streams: list[ResponseStream]) -> None:
        """Each item the generator yields is one response per request; its end is the final flag."""
        try:
            for step in self.handler(calls):
                pieces: list[Any] = list(step)
                if len(pieces) != len(calls):
                    raise internal(f"the model yielded {len(pieces)} responses for {len(calls)} requests")
                for stream, piece in zip(streams, pieces):
                    if not stream.closed:
                        stream.send(Piece(outputs={name: np.asarray(array) for name, array in piece.items()}))
        except Exception as exc:  # ends every stream of the batch with the error
            for stream in streams:
                if not stream.closed:
                    stream.send(Piece(error=model_error(exc), final=True))
            return
        for stream in streams:
            if not stream.closed:
                stream.send(Piece(final=True))

    def readiness(self) -> tuple[bool, str]:
        return True, ""

    def sequence_ended(self, correlation_id: CorrelationId, reason: str) -> None:
        pass

    def close(self) -> None:
        pass  # the function belongs to its binding, which outlives the instance


class InProcessModels:
    """The callables this process serves, by model name: the worker's backend for them."""

    def __init__(self) -> None:
        self._models: dict[str, CallableModel] = {}
        self._counters: dict[str, itertools.count] = {}
        self._lock = threading.Lock()

    def register(self, name: str, model: CallableModel) -> None:
        with self._lock:
            self._models[name] = model
            self._counters[name] = itertools.count()

    def unregister(self, name: str) -> None:
        with self._lock:
            self._models.pop(name, None)
            self._counters.pop(name, None)

    def hosts(self, name: str) -> bool:
        with self._lock:
            return name in self._models

    def create(self, spec: ModelSpec, model_dir: Path, placement: Placement) -> CallableInstance:
        """The next instance of a bound model (the worker's `Backend.create`)."""
        with self._lock:
            model = self._models.get(spec.name)
            index = next(self._counters[spec.name]) if model is not None else 0
        if model is None:
            raise unavailable(f"no function is bound to model '{spec.name}' in this process")
        # instances are created in order, so instance i takes the i-th function (PyTriton's list of callables)
        return CallableInstance(spec, model.handler(index), placement.name or f"{spec.name}_{index}")

    def default_threads(self, instances: int) -> int:
        return 1

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from services.worker.python import pb_utils
from services.worker.python.backend import DECOUPLED, ModelError
from shared.errors import Code, ShoalError, internal, unavailable
from shared.model_config import ModelSpec

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
        return ModelError(exc.message, str(exc.code))
    return ModelError(f"{type(exc).__name__}: {exc}", "INTERNAL")


class CallableInstance:
    checks_readiness = False

    def __init__(self, spec: ModelSpec, handler: Handler, name: str) -> None:
        self.spec, self.handler, self.name = spec, handler, name

    def run_requests(
        self,
        requests: list[dict[str, np.ndarray]],
        output_names: list[list[str]],
        metadata: list[dict],
        deadline_ns: int = 0,
    ) -> list[dict[str, np.ndarray] | ModelError | str]:
        calls = [
            CallRequest(
                dict(arrays),
                dict(meta.get("parameters") or {}),
                list(names),
                str(meta.get("request_id") or ""),
                meta.get("cancelled") or (lambda: False),
            )
            for arrays, names, meta in zip(requests, output_names, metadata)
        ]
        if self.spec.decoupled:
            self._stream(calls, [meta["response_sender"] for meta in metadata])
            return [DECOUPLED] * len(calls)
        try:
            results: list[Any] = list(self.handler(calls))
        except Exception as exc:  # the function raised: its requests fail, the worker goes on
            return [model_error(exc)] * len(calls)
        if len(results) != len(calls):
            error = ModelError(f"the model returned {len(results)} responses for {len(calls)} requests", "INTERNAL")
            return [error] * len(calls)
        return [dict(result) for result in results]

    def _stream(self, calls: list[CallRequest], senders: list[pb_utils.InferenceResponseSender]) -> None:
        try:
            steps: Iterable[Any] = self.handler(calls)
            for step in steps:
                pieces: list[Any] = list(step)
                if len(pieces) != len(calls):
                    raise internal(f"the model yielded {len(pieces)} responses for {len(calls)} requests")
                for sender, piece in zip(senders, pieces):
                    tensors = [pb_utils.Tensor(name, np.asarray(array)) for name, array in piece.items()]
                    sender.send(pb_utils.InferenceResponse(output_tensors=tensors))
        except Exception as exc:  # ends every stream of the batch with the error
            error = model_error(exc)
            for sender in senders:
                if not sender.closed:
                    triton_error = pb_utils.TritonError(error.message, pb_utils.TritonError.code_of(error.code))
                    sender.send(
                        pb_utils.InferenceResponse(error=triton_error), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    )
            return
        for sender in senders:
            if not sender.closed:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """One request outside the scheduler (warmup); a decoupled model's responses are dropped."""
        meta: dict = {}
        if self.spec.decoupled:
            meta["response_sender"] = pb_utils.InferenceResponseSender(lambda response, flags: None, lambda: False)
        result = self.run_requests([inputs], [output_names], [meta])[0]
        if isinstance(result, str):
            return {}
        if isinstance(result, ModelError):
            raise ShoalError(result.message, Code(result.code))
        return result

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

    def create_instance(
        self, spec: ModelSpec, model_dir: Path, version: int, kind: str, device: int, threads: int, name: str = ""
    ) -> CallableInstance:
        with self._lock:
            model = self._models.get(spec.name)
            index = next(self._counters[spec.name]) if model is not None else 0
        if model is None:
            raise unavailable(f"no function is bound to model '{spec.name}' in this process")
        # instances are created in order, so instance i takes the i-th function (PyTriton's list of callables)
        return CallableInstance(spec, model.handler(index), name or f"{spec.name}_{index}")

    def default_threads(self, instances: int) -> int:
        return 1

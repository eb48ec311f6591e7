"""Triton python-backend models (`model.py` with `TritonPythonModel`), run unchanged.

Each instance imports its own copy of `model.py` and runs in the hosting worker process, on
the instance's thread: numpy inputs are handed over without the copies Triton's stub process
makes. Isolation comes from the worker itself (`services/worker/python/processes/isolation.py`: by default a
python model's worker hosts nothing else). A model that raises only fails its requests.

An `async def execute` runs on one event loop per instance, kept running in a thread of its
own like the loop of Triton's stub: tasks the model starts (a decoupled model answering from
`asyncio.create_task`, say) go on after `execute` returns.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json
import logging
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from services.worker.backends import Backend, Placement
from services.worker.backends.runner import (
    RESCHEDULED,
    STREAMED,
    Batch,
    CorrelationId,
    ModelError,
    Piece,
    RequestContext,
    Result,
    Unheard,
    Work,
)
from services.worker.python.hosting import backend_settings
from services.worker.python.hosting.single_response import SingleResponse, returned
from services.worker.python.processes import execution_environments
from services.worker.python.triton_api import numpy_compat, pb_utils
from shared.config.model_config import ModelSpec
from shared.errors import Code, unavailable

log = logging.getLogger("shoal.worker")


def _piece(response: pb_utils.InferenceResponse | None, flags: int) -> Piece:
    final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    if response is None:
        return Piece(final=final)
    error = response.error()
    if error is not None:
        return Piece(error=ModelError(error.message(), error.code_name()), final=final)
    outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
    return Piece(outputs=outputs, parameters=json.loads(response.parameters()), final=final)


def _sender(context: RequestContext, slot: SingleResponse | None) -> pb_utils.InferenceResponseSender:
    """A decoupled request's sender streams its responses; a non-decoupled one's keeps its one
    response in `slot` (python_backend lets both kinds of model use it)."""
    if slot is not None:
        return pb_utils.InferenceResponseSender(slot.send, context.cancelled, decoupled=False)
    stream = context.responses or Unheard()
    return pb_utils.InferenceResponseSender(
        lambda response, flags: stream.send(_piece(response, flags)), context.cancelled
    )


def _request(work: Work, slot: SingleResponse | None) -> pb_utils.InferenceRequest:
    context = work.context
    return pb_utils.InferenceRequest(
        inputs=[pb_utils.Tensor(n, a) for n, a in work.inputs.items()],
        requested_output_names=work.outputs,
        request_id=context.request_id,
        correlation_id=context.correlation_id,
        flags=context.flags,
        parameters=context.parameters,  # InferenceRequest keeps a copy
        timeout=context.timeout_us,
        cancelled=context.cancelled,
        response_sender=_sender(context, slot),
        trace=pb_utils.InferenceTrace(context.trace),
    )


def _import(path: Path, keep_path: bool = False) -> ModuleType:
    """Import a `model.py`; its folder is on `sys.path` while it imports its sibling files (for a
    python-based backend's folder, for good: its modules may import their siblings lazily)."""
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    numpy_compat.install()  # models written for Triton's numpy 1 environment run unchanged
    name = f"shoal_python_model_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise unavailable(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    if keep_path and folder in sys.path:
        keep_path = False  # another instance of the backend put it there already
    sys.path.insert(0, folder)  # models import their sibling files
    try:
        spec.loader.exec_module(module)
    finally:
        if not keep_path:
            sys.path.remove(folder)
    return module


class PythonInstance:
    batches_rows = False  # execute() sees the requests one by one

    def __init__(self, spec: ModelSpec, path: Path, placement: Placement, runtime: Path | None = None) -> None:
        """`path`: the version's `model.py`; for a python-based backend (`runtime`: its
        `<backend-directory>/<backend>/model.py`), the version's directory, which the backend's
        model.py sees as `pb_utils.get_model_dir()` (as in Triton: vLLM reads its model.json there)."""
        kind, device, version = placement.kind, placement.device, placement.version
        name = placement.name or f"{spec.name}_0"
        version_dir = path if runtime is not None else path.parent
        backend_settings.check(placement.settings)
        execution_environments.check(spec.parameters, str(version_dir.parent))  # <model>/<version>/model.py
        module = _import(runtime, keep_path=True) if runtime is not None else _import(path)
        if not hasattr(module, "TritonPythonModel"):
            raise unavailable(f"{runtime or path} does not define TritonPythonModel")
        self.spec = spec
        self.iterative = bool(spec.config.get("sequence_batching", {}).get("iterative_sequence", False))
        self.model_dir = str(version_dir)
        self.model = module.TritonPythonModel()
        args = {
            "model_config": json.dumps(spec.config),
            # Triton's python backend hands over "CPU"/"GPU"/"MODEL" and the instance's device
            "model_instance_kind": kind.removeprefix("KIND_") if kind != "KIND_AUTO" else "CPU",
            "model_instance_name": name,
            "model_instance_device_id": str(device),
            "model_repository": str(version_dir.parent),  # the model's own directory, as in Triton
            "model_version": str(version),
            "model_name": spec.model_name,
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        pb_utils.set_context(model_dir=self.model_dir)
        if hasattr(self.model, "initialize"):
            self.model.initialize(args)

    def _await(self, coroutine) -> object:
        """Run a coroutine of the model's on the instance's long-lived event loop."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, name=f"{self.spec.name}-asyncio", daemon=True
            )
            self._loop_thread.start()
        deadline_ns = pb_utils.get_deadline_ns()

        async def with_context():
            pb_utils.set_context(deadline_ns, self.model_dir)  # BLS deadline for the loop's thread too
            return await coroutine

        return asyncio.run_coroutine_threadsafe(with_context(), self._loop).result()

    @property
    def checks_readiness(self) -> bool:
        return hasattr(self.model, "is_ready")

    def readiness(self) -> tuple[bool, str]:
        """The model's own `is_ready()`, as python_backend's stub runs it (pb_stub.cc
        `ProcessUserModelReadinessRequest`): a coroutine is awaited (on the instance's loop), a
        result that is not a bool or an exception is "not ready" with its message. Called from a
        thread of its own, so it runs beside a long `execute`, as the stub's monitor thread does."""
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return True, ""
        try:
            result = check()
            if asyncio.iscoroutine(result):
                result = self._await(result)
            if not isinstance(result, bool):
                return False, "is_ready() must return a boolean value"
            return result, ""
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"

    def execute(self, batch: Batch) -> list[Result]:
        """One `execute` call for the batch's requests; a result or an error per request, or
        `STREAMED` for a request whose responses the model sends through its sender."""
        decoupled = self.spec.decoupled
        slots = [None if decoupled else SingleResponse() for _ in batch.work]
        requests = [_request(work, slot) for work, slot in zip(batch.work, slots)]
        batch.inputs_ready()
        pb_utils.set_context(batch.deadline_ns, self.model_dir)  # BLS requests inherit the batch's deadline
        try:
            responses = self.model.execute(requests)
            if inspect.isawaitable(responses):
                responses = self._await(responses)
        except pb_utils.TritonError as exc:
            return self._failed(requests, slots, ModelError(exc.message(), exc.code_name()))
        except Exception as exc:  # the model raised: its requests fail, the worker goes on
            return self._failed(requests, slots, ModelError(f"{type(exc).__name__}: {exc}", Code.INTERNAL))
        if decoupled:  # what execute returns is ignored, as in Triton
            return [self._released(request, STREAMED) for request in requests]
        answers = self._collected(requests, [s for s in slots if s is not None], responses)
        del requests, responses  # now only the model's references keep a request answerable
        return [
            answer.wait(work, batch.deadline_ns) if isinstance(answer, SingleResponse) else answer
            for answer, work in zip(answers, batch.work)
        ]

    def _collected(
        self, requests: list[pb_utils.InferenceRequest], slots: list[SingleResponse], responses: object
    ) -> Sequence[Result | SingleResponse]:
        """A non-decoupled execute's results: what it returned or, for a request it returned None
        for (or None for all, as python_backend allows), the slot its sender will fill."""
        if responses is None:
            responses = [None] * len(requests)
        if not isinstance(responses, list) or len(responses) != len(requests):
            got = len(responses) if isinstance(responses, list) else type(responses).__name__
            message = f"execute returned {got} responses for {len(requests)} requests"
            return self._failed(requests, slots, ModelError(message, Code.INTERNAL))
        for request, response in zip(requests, responses):
            if response is None:
                continue
            if request._rescheduled():  # pb_stub.cc fails the whole execute
                found = "InferenceResponse" if isinstance(response, pb_utils.InferenceResponse) else type(response)
                message = (
                    "Expected a None object in the execute function return list for reschduled request, "
                    f"found type '{found}'."
                )
                return self._failed(requests, slots, ModelError(message, Code.INTERNAL))
            try:  # a returned response counts as sent: an error where the sender sent one already
                assert request._sender is not None
                request._sender._returned(response)
            except pb_utils.TritonModelException as exc:
                return self._failed(requests, slots, ModelError(str(exc), Code.INTERNAL))
        return [self._answer(*answer) for answer in zip(requests, responses, slots)]

    def _failed(
        self, requests: list[pb_utils.InferenceRequest], slots: Sequence[SingleResponse | None], error: ModelError
    ) -> list[Result]:
        """The execute failed: a request the model answered through its sender keeps that answer (the
        backend skips closed requests), the others get the error; no sender sends any more."""
        for request in requests:
            if request._sender is not None:
                request._sender._close()
        results: list[Result] = [s.result if s is not None and s.result is not None else error for s in slots]
        if any(result is not error for result in results):  # a client will not see it: the log says it
            log.error("Failed to process the request(s) for model '%s', message: %s", self.spec.name, error.message)
        return results

    def _answer(
        self, request: pb_utils.InferenceRequest, response: pb_utils.InferenceResponse | None, slot: SingleResponse
    ) -> Result | SingleResponse:
        if response is not None:
            return self._released(request, returned(response))
        if request._rescheduled():
            return self._released(request, None)
        slot.watch(request)
        return slot

    def _released(self, request: pb_utils.InferenceRequest, result: Result | None) -> Result:
        """What a request's release flags make of its result: RESCHEDULE runs it again later, on a
        model whose sequence batcher is iterative; on any other model core refuses the flag."""
        if not request._rescheduled():
            if result is None:
                return ModelError("execute returned None for a request it did not reschedule", Code.INTERNAL)
            return result
        if not self.iterative:
            return ModelError(
                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                "configured to handle such a flag.",
                Code.INVALID_ARG,
            )
        return RESCHEDULED

    def sequence_ended(self, correlation_id: CorrelationId, reason: str) -> None:
        """Shoal-only, optional: a model's `sequence_ended(correlation_id, reason)` hears of a sequence
        that ended without its END request."""
        hook = getattr(self.model, "sequence_ended", None)
        if callable(hook):
            hook(correlation_id, reason)

    def close(self) -> None:
        try:
            if hasattr(self.model, "finalize"):
                result = self.model.finalize()
                if inspect.isawaitable(result):
                    self._await(result)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        """Cancel what the model left running on its loop (their requests' clients get their
        deadline error), then stop and close the loop."""
        loop = self._loop
        if loop is None:
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=5)
        except Exception:
            pass  # a model task that will not end: the loop stops anyway
        loop.call_soon_threadsafe(loop.stop)
        self._loop_thread.join(timeout=5)
        if not loop.is_running():
            loop.close()


BACKEND = Backend("model.py", PythonInstance, file_only=True)


def python_based(runtime: Path) -> Backend:
    """A python-based backend: every model naming it runs `runtime` (Triton's
    `<backend-directory>/<backend>/model.py`), with the model's version directory as its own."""
    return Backend("", functools.partial(PythonInstance, runtime=runtime))

"""Triton python-backend models (`model.py` with `TritonPythonModel`), run unchanged.

Each instance imports its own copy of `model.py` and runs in the hosting worker process, on
the instance's thread: numpy inputs are handed over without the copies Triton's stub process
makes. Isolation comes from the worker itself (`services/worker/python/isolation.py`: by default a
python model's worker hosts nothing else). A model that raises only fails its requests.

An `async def execute` runs on one event loop per instance, kept running in a thread of its
own like the loop of Triton's stub: tasks the model starts (a decoupled model answering from
`asyncio.create_task`, say) go on after `execute` returns.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
import threading
import uuid
from pathlib import Path

import numpy as np

from services.worker.backends import model_path
from services.worker.python import pb_utils
from shared.errors import ShoalError, unavailable
from shared.model_config import ModelSpec

DECOUPLED = "decoupled"  # a request whose responses the model sends itself, through its response sender


class ModelError(Exception):
    """A request the model answered with a `TritonError` (or by raising)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def _import(path: Path):
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    name = f"shoal_python_model_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # models import their sibling files
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


class PythonInstance:
    def __init__(
        self, spec: ModelSpec, path: Path, version: int, name: str, kind: str = "KIND_CPU", device: int = 0
    ) -> None:
        module = _import(path)
        if not hasattr(module, "TritonPythonModel"):
            raise unavailable(f"{path} does not define TritonPythonModel")
        self.spec = spec
        self.model_dir = str(path.parent)
        self.model = module.TritonPythonModel()
        args = {
            "model_config": json.dumps(spec.config),
            # Triton's python backend hands over "CPU"/"GPU"/"MODEL" and the instance's device
            "model_instance_kind": kind.removeprefix("KIND_") if kind != "KIND_AUTO" else "CPU",
            "model_instance_name": name,
            "model_instance_device_id": str(device),
            "model_repository": str(path.parent.parent),
            "model_version": str(version),
            "model_name": spec.name,
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
        deadline_ns = getattr(pb_utils._context, "deadline_ns", 0)

        async def with_context():
            pb_utils.set_context(deadline_ns, self.model_dir)  # BLS deadline for the loop's thread too
            return await coroutine

        return asyncio.run_coroutine_threadsafe(with_context(), self._loop).result()

    @property
    def checks_readiness(self) -> bool:
        return hasattr(self.model, "is_ready")

    def is_ready(self) -> bool:
        """The model's own `is_ready()`, if it has one (a raising model is not ready)."""
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return True
        try:
            return bool(check())
        except Exception:
            return False

    def run_requests(
        self,
        requests: list[dict[str, np.ndarray]],
        output_names: list[list[str]],
        metadata: list[dict],
        deadline_ns: int = 0,
    ) -> list[dict[str, np.ndarray] | ModelError | str]:
        """One `execute` call for the batch's requests; a result or an error per request, or
        `DECOUPLED` for a request whose responses the model sends through its sender."""
        batch = [
            pb_utils.InferenceRequest(
                inputs=[pb_utils.Tensor(n, a) for n, a in arrays.items()], requested_output_names=names, **meta
            )
            for arrays, names, meta in zip(requests, output_names, metadata)
        ]
        pb_utils.set_context(deadline_ns, self.model_dir)  # BLS requests inherit the batch's deadline
        try:
            responses = self.model.execute(batch)
            if inspect.isawaitable(responses):
                responses = self._await(responses)
        except pb_utils.TritonError as exc:
            return [ModelError(exc.message(), exc.code_name())] * len(batch)
        except Exception as exc:  # the model raised: its requests fail, the worker goes on
            return [ModelError(f"{type(exc).__name__}: {exc}", "INTERNAL")] * len(batch)
        if self.spec.decoupled:
            return [DECOUPLED] * len(batch)  # what execute returns is ignored, as in Triton
        if not isinstance(responses, list) or len(responses) != len(batch):
            got = len(responses) if isinstance(responses, list) else type(responses).__name__
            return [ModelError(f"execute returned {got} responses for {len(batch)} requests", "INTERNAL")] * len(batch)
        results: list[dict[str, np.ndarray] | ModelError] = []
        for response in responses:
            if response.has_error():
                error = response.error()
                results.append(ModelError(error.message(), error.code_name()))
            else:
                results.append({t.name(): t.as_numpy() for t in response.output_tensors()})
        return results

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """One request outside the scheduler (warmup); a decoupled model's responses are dropped."""
        meta: dict = {}
        if self.spec.decoupled:
            meta["response_sender"] = pb_utils.InferenceResponseSender(lambda response, flags: None, lambda: False)
        result = self.run_requests([inputs], [output_names], [meta])[0]
        if isinstance(result, str):
            return {}
        if isinstance(result, ModelError):
            raise ShoalError(result.message, result.code)
        return result

    def close(self) -> None:
        try:
            if hasattr(self.model, "finalize"):
                result = self.model.finalize()
                if inspect.isawaitable(result):
                    self._await(result)
        finally:
            if self._loop is not None:
                self._stop_loop()

    def _stop_loop(self) -> None:
        """Cancel what the model left running on its loop (their requests' clients get their
        deadline error), then stop and close the loop."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result(timeout=5)
        except Exception:
            pass  # a model task that will not end: the loop stops anyway
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()


def create_instance(
    spec: ModelSpec, model_dir: Path, version: int, kind: str, device: int, threads: int, name: str = ""
) -> PythonInstance:
    path = model_path(spec, model_dir, version, "model.py", is_file=True)
    return PythonInstance(spec, path, version, name or f"{spec.name}_0", kind, device)


def default_threads(instances: int) -> int:
    return 1

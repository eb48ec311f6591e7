"""Triton's DALI backend (`backend: "dali"`): serialized DALI pipelines, as an ensemble's first step.

As Triton's DALI backend: the model is `model.dali` (a serialized pipeline) unless
`default_model_filename` names another; a file that does not deserialize and ends in `.py`, or
else the version's `dali.py`, is a Python pipeline definition marked `@autoserialize`, which
is serialized at load. The pipeline runs with the config's `max_batch_size` as its batch size
and `parameters { key: "num_threads" }` CPU threads (else the pipeline's own). Each config
input feeds the `fn.external_source` of the same name, one sample per row of the batch; the
pipeline's outputs are the config's outputs in order. A KIND_CPU instance runs the pipeline
without a GPU (`device_id=None`: CPU operators only, `fn.decoders.image(device="cpu")`); a
KIND_GPU instance runs it on the instance's GPU (mixed and GPU operators). `--backend-config=
dali,release_after_unload=true` releases DALI's memory pools when a model unloads.

Needs the DALI wheel: `pip install 'shoal[dali]'` (nvidia-dali-cuda130, whose CPU operators run
on a host without a GPU). Not yet: `split_along_outer_axis`, configuration auto-complete from
the pipeline, outputs of different shapes within one batch (Triton's DALI backend answers ragged
batches only for `split_along_outer_axis` outputs too).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from services.worker.backends import Backend, Placement, model_path
from services.worker.backends.parameters import integer
from services.worker.backends.runner import BatchedRunner, Tensors
from shared.config.model_config import ModelSpec
from shared.errors import internal, invalid, unavailable, unsupported

log = logging.getLogger("shoal.worker")
EXTRA = "pip install 'shoal[dali]'"


def _dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError:
        raise unavailable(f"the DALI backend needs the DALI wheel: {EXTRA}") from None
    return dali


def _autoserialize(dali: Any, definition: Path) -> bytes:
    """Serialize the `@autoserialize` pipeline a Python file defines (DALI's own helper)."""
    from nvidia.dali._utils.autoserialize import invoke_autoserialize

    name = f"shoal_dali_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, definition)
    if spec is None or spec.loader is None:
        raise unavailable(f"cannot import {definition}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        with tempfile.NamedTemporaryFile(suffix=".dali") as serialized:
            invoke_autoserialize(module, serialized.name)
            return Path(serialized.name).read_bytes()
    except RuntimeError as exc:
        raise invalid(f"cannot autoserialize the DALI pipeline in {definition}: {exc}") from None
    finally:
        sys.modules.pop(name, None)


def pipeline_bytes(dali: Any, spec: ModelSpec, version_dir: Path) -> bytes:
    """The serialized pipeline, found as Triton's DALI backend finds it."""
    try:
        path = model_path(spec, version_dir.parent, int(version_dir.name), "model.dali", True)
    except Exception:
        path = None
    if path is not None:
        data = path.read_bytes()
        if path.suffix != ".py":
            return data
        return _autoserialize(dali, path)
    definition = version_dir / "dali.py"
    if definition.is_file():
        return _autoserialize(dali, definition)
    raise unavailable(
        f"unable to find '{version_dir / (spec.default_model_filename or 'model.dali')}' or '{definition}' "
        f"for model '{spec.name}'"
    )


class DaliInstance(BatchedRunner):
    def __init__(self, spec: ModelSpec, version_dir: Path, placement: Placement) -> None:
        super().__init__(spec)
        dali = _dali()
        if spec.parameters.get("split_along_outer_axis"):
            raise unsupported(
                f"model '{spec.name}': split_along_outer_axis is not supported by Shoal's DALI backend yet"
            )
        self.batch_size = max(1, spec.max_batch_size)
        threads = integer(spec, "num_threads") or None
        device = placement.device if placement.kind == "KIND_GPU" else None
        self.release = placement.settings.get("release_after_unload", "").lower() == "true"
        serialized = pipeline_bytes(dali, spec, version_dir)
        options: dict[str, Any] = {"batch_size": self.batch_size, "device_id": device}
        if threads:
            options["num_threads"] = threads
        try:
            self.pipeline = dali.Pipeline.deserialize(serialized_pipeline=serialized, **options)
            self.pipeline.build()
        except RuntimeError as exc:
            where = (
                ""
                if device is not None
                else " (a KIND_CPU instance runs CPU operators only: GPU and mixed ones need KIND_GPU)"
            )
            raise internal(
                f"DALI could not build the pipeline of model '{spec.name}'{where}: {str(exc).splitlines()[0]}"
            ) from None
        self.names = [tensor.name for tensor in spec.outputs]

    def run(self, inputs: Tensors, output_names: list[str]) -> Tensors:
        rows = len(next(iter(inputs.values()))) if inputs else 0
        if self.spec.max_batch_size == 0:
            inputs = {name: array[np.newaxis] for name, array in inputs.items()}
            rows = 1
        for name, array in inputs.items():
            self.pipeline.feed_input(name, [array[i] for i in range(rows)])
        outputs = self.pipeline.run()
        if len(outputs) != len(self.names):
            raise internal(
                f"the DALI pipeline produced {len(outputs)} outputs, the configuration names {len(self.names)}"
            )
        answer: Tensors = {}
        for name, batch in zip(self.names, outputs):
            if name not in output_names:
                continue
            if hasattr(batch, "as_cpu"):
                batch = batch.as_cpu()
            if not batch.is_dense_tensor():
                raise internal(f"the DALI pipeline's output '{name}' has samples of different shapes")
            array = np.array(batch.as_tensor())
            answer[name] = array[0] if self.spec.max_batch_size == 0 else array
        return answer

    def close(self) -> None:
        del self.pipeline
        if self.release:
            import nvidia.dali.backend as dali_backend

            dali_backend.ReleaseUnusedMemory()  # type: ignore[attr-defined]  # a compiled module


BACKEND = Backend("", DaliInstance)

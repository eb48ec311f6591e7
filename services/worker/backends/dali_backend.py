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
on a host without a GPU). `split_along_outer_axis` splits the named outputs' samples along their
outer axis (dali_outputs.py); each request's outputs are its own rows', so requests batched
together may answer different shapes, as in Triton's backend.
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

from services.worker.backends import Backend, Placement, dali_outputs, model_path
from services.worker.backends.dali_outputs import outputs_to_split
from services.worker.backends.parameters import integer
from services.worker.backends.runner import Batch, BatchedRunner, Result, Tensors
from shared.config.model_config import ModelSpec
from shared.errors import internal, invalid, unavailable

log = logging.getLogger("shoal.worker")
EXTRA = "pip install 'shoal[dali]'"


def _dali() -> Any:
    try:
        import nvidia.dali as dali
    except ImportError:
        raise unavailable(f"the DALI backend needs the DALI wheel: {EXTRA}") from None
    return dali


def autoserialize(dali: Any, definition: Path) -> bytes:
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
        return autoserialize(dali, path)
    definition = version_dir / "dali.py"
    if definition.is_file():
        return autoserialize(dali, definition)
    raise unavailable(
        f"unable to find '{version_dir / (spec.default_model_filename or 'model.dali')}' or '{definition}' "
        f"for model '{spec.model_name}'"
    )


class DaliInstance(BatchedRunner):
    def __init__(self, spec: ModelSpec, version_dir: Path, placement: Placement) -> None:
        super().__init__(spec)
        dali = _dali()
        self.split = outputs_to_split(spec.parameters.get("split_along_outer_axis", ""))
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
                f"DALI could not build the pipeline of model '{spec.model_name}'{where}: {str(exc).splitlines()[0]}"
            ) from None
        self.names = [tensor.name for tensor in spec.outputs]

    def execute(self, batch: Batch) -> list[Result]:
        # each request's rows are samples as they are: a ragged input (`allow_ragged_batch`, which
        # auto-complete sets) keeps each request's own shape, as Triton's DALI backend feeds it
        batch.inputs_ready()
        names = {n for w in batch.work for n in w.outputs}
        if self.spec.max_batch_size == 0:  # one sample, the request's tensor (no batch dimension)
            samples = self._samples({name: [array] for name, array in batch.work[0].inputs.items()}, names)
            return [{name: outputs[0] for name, outputs in samples.items()}]
        fed = {name: [row for w in batch.work for row in w.inputs[name]] for name in batch.work[0].inputs}
        samples = self._samples(fed, names)
        return list(dali_outputs.per_request(samples, [w.batch_size for w in batch.work], self.split))

    def run(self, inputs: Tensors, output_names: list[str]) -> Tensors:
        if self.spec.max_batch_size == 0:
            samples = self._samples({name: [array] for name, array in inputs.items()}, set(output_names))
            return {name: outputs[0] for name, outputs in samples.items()}
        samples = self._samples({name: list(array) for name, array in inputs.items()}, set(output_names))
        return {name: dali_outputs.dense(name, outputs) for name, outputs in samples.items()}

    def _samples(self, inputs: dict[str, list[np.ndarray]], wanted: set[str]) -> dict[str, list[np.ndarray]]:
        """Each wanted output's samples, one per input sample (DALI's TensorList)."""
        for name, rows in inputs.items():
            self.pipeline.feed_input(name, rows)
        outputs = self.pipeline.run()
        if len(outputs) != len(self.names):
            raise internal(
                f"the DALI pipeline produced {len(outputs)} outputs, the configuration names {len(self.names)}"
            )
        samples: dict[str, list[np.ndarray]] = {}
        for name, tensors in zip(self.names, outputs):
            if name in wanted:
                tensors = tensors.as_cpu() if hasattr(tensors, "as_cpu") else tensors
                samples[name] = [np.array(tensors.at(i)) for i in range(len(tensors))]
        return samples

    def close(self) -> None:
        del self.pipeline
        if self.release:
            import nvidia.dali.backend as dali_backend

            dali_backend.ReleaseUnusedMemory()  # type: ignore[attr-defined]  # a compiled module


BACKEND = Backend("", DaliInstance)

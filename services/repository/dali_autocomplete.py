"""Triton's DALI auto-complete (dali_backend's `AutofillConfig`): a config completed from what the
serialized pipeline declares, its external sources (name, type, number of dimensions), its
outputs (name, declared type and number of dimensions) and its batch size.

The rules, as the DALI backend applies them: every config input must be one of the pipeline's
inputs; each pipeline input gets its name, data type and dims (-1 per declared dimension), and
`allow_ragged_batch`; the config's outputs are the pipeline's in order (a config's name wins),
the ones the config leaves out are appended; a data type or dims the config states must agree
with the pipeline's (-1 matches anything); `max_batch_size` is the pipeline's unless the config
gives one (a config with `max_batch_size: 0` is not batched: its dims carry the batch as -1);
a batched model gets `dynamic_batching`. Outputs named by `split_along_outer_axis` lose their
outer dimension. The pipeline is read in a separate process (`dali_introspect`: DALI is heavy
and an `@autoserialize` file runs the user's code).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.config import triton_protos
from shared.errors import invalid

pb: Any = triton_protos.load("model_config_pb2")

INTROSPECT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class PipelineIO:
    name: str
    data_type: str  # TYPE_FP32, ...; TYPE_INVALID where the pipeline declares none
    ndim: int | None  # None: not declared


@dataclass(frozen=True)
class Pipeline:
    inputs: list[PipelineIO]
    outputs: list[PipelineIO]
    max_batch_size: int


def unbatched(config_text: str) -> bool:
    """The DALI backend reads `max_batch_size` from the config file's text: 0 there means a model
    without batching (absent, it is batched)."""
    found = re.search(r"^\s*max_batch_size\s*:\s*(-?\d+)", config_text, re.MULTILINE)
    return found is not None and int(found.group(1)) == 0


def _match(name: str, config: list[int], pipeline: list[int]) -> list[int]:
    if len(config) != len(pipeline):
        raise invalid(
            f'Mismatch in number of dimensions for "{name}"\nNumber of dimensions defined in config: '
            f"{len(config)}\nNumber of dimensions defined in pipeline: {len(pipeline)}"
        )
    for c, p in zip(config, pipeline):
        if c != p and c != -1 and p != -1:
            raise invalid(
                f"Mismath in dims for {name}\nDims defined in config: {config}\nDims defined in pipeline: {pipeline}"
            )
    return [max(c, p) if c != p else c for c, p in zip(config, pipeline)]


def _fill(io: pb.ModelInput | pb.ModelOutput, model: PipelineIO, batched: bool) -> None:
    if not io.name:
        io.name = model.name
    stated = pb.DataType.Name(io.data_type)
    if stated != "TYPE_INVALID":
        if model.data_type != "TYPE_INVALID" and stated != model.data_type:
            raise invalid(
                f'Mismatch of data_type config for "{model.name}".\nData type defined in config: {stated}\n'
                f"Data type defined in pipeline: {model.data_type}"
            )
    else:
        io.data_type = pb.DataType.Value(model.data_type)
    if model.ndim is not None:
        shape = [-1] * model.ndim if batched else [-1] * (model.ndim + 1)
        dims = _match(model.name, list(io.dims), shape) if io.dims else shape
        del io.dims[:]
        io.dims.extend(dims)


def autofill(config: pb.ModelConfig, pipeline: Pipeline, batched: bool, split: set[str] | None = None) -> None:
    """`config` completed from the pipeline, in place, with the DALI backend's checks and texts;
    `split`: the pipeline outputs `split_along_outer_axis` names (their outer dimension goes)."""
    names = {model.name for model in pipeline.inputs}
    for index, io in enumerate(config.input):
        if not io.name:
            raise invalid(f"The input at index {index} in the model configuration does not contain a `name` field.")
        if io.name not in names:
            raise invalid(
                f"Configuration file contains config for {io.name} but such input is not present in the pipeline."
            )
    for model in pipeline.inputs:
        io = next((i for i in config.input if i.name == model.name), None) or config.input.add()
        _fill(io, model, batched)
        io.allow_ragged_batch = True
    if len(config.output) > len(pipeline.outputs):
        raise invalid(
            "The number of outputs specified in the DALI pipeline and the configuration file do not match."
            f"\nModel config outputs: {len(config.output)}\nPipeline outputs: {len(pipeline.outputs)}"
        )
    for index, model in enumerate(pipeline.outputs):
        if model.name in (split or ()) and model.ndim is not None:
            model = PipelineIO(model.name, model.data_type, max(model.ndim - 1, 0))
        _fill(config.output[index] if index < len(config.output) else config.output.add(), model, batched)
    if batched and config.max_batch_size <= 0:
        config.max_batch_size = pipeline.max_batch_size
    if batched and not config.HasField("dynamic_batching"):
        config.dynamic_batching.SetInParent()


# what the introspecting child keeps of the repository's environment: a `.py` pipeline is the
# model's own code, run here, and the repository holds the keys to everything (docs/security.md):
# its bus credentials and the cloud's keys stay out of the child (it still runs as the same user)
_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONPATH", "LD_LIBRARY_PATH", "TMPDIR", "VIRTUAL_ENV")


def _introspection_env() -> dict[str, str]:
    return {name: os.environ[name] for name in _KEPT if name in os.environ}


def read_pipeline(model_dir: Path, version: int, filename: str) -> Pipeline | None:
    """What the version's pipeline declares (`dali_introspect`, in its own process); None without DALI."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "services.worker.backends.dali_introspect", str(model_dir / str(version)), filename],
            capture_output=True,
            text=True,
            timeout=INTROSPECT_TIMEOUT_S,
            env=_introspection_env(),
        )
    except subprocess.TimeoutExpired:
        raise invalid(
            f"the DALI pipeline of '{model_dir.name}' could not be read within {INTROSPECT_TIMEOUT_S:.0f} s"
        ) from None
    if done.returncode == 3:  # no DALI here: the worker's load says what to install
        return None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise invalid(f"DALI auto-complete of '{model_dir.name}' failed: {detail}")
    found = json.loads(done.stdout)
    return Pipeline(
        [PipelineIO(**io) for io in found["inputs"]],
        [PipelineIO(**io) for io in found["outputs"]],
        found["max_batch_size"],
    )

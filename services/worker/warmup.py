"""`model_warmup`: sample requests run on every instance before the model is READY."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from services.worker.backends.runner import Batch, ModelError, Work
from services.worker.batches.instances import LoadedModel
from shared.config.datatypes import config_to_protocol, deserialize_bytes, element_count, numpy_dtype
from shared.config.paths import inside
from shared.errors import ShoalError, invalid

log = logging.getLogger("shoal.worker")


def warmup_inputs(spec_json: dict[str, Any], warmup: dict[str, Any], model_dir: Path) -> dict[str, np.ndarray]:
    """One sample's inputs (no batch dimension) as the warmup entry describes them."""
    arrays: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    for name, data in warmup.get("inputs", {}).items():
        datatype = config_to_protocol(data.get("data_type", "TYPE_INVALID"))
        dims = [int(d) for d in data.get("dims", [])]
        count = element_count(dims)
        if "input_data_file" in data:
            path = inside(model_dir / "warmup", data["input_data_file"])
            raw = path.read_bytes()
            if datatype == "BYTES":
                array = deserialize_bytes(raw, count)
            else:
                array = np.frombuffer(raw, dtype=numpy_dtype(datatype), count=count).copy()
        elif datatype == "BYTES":
            array = np.array([b"\0"] * count, dtype=object)  # random BYTES: zeros, as Triton does
        elif data.get("random_data"):
            array = _random(rng, datatype, count)
        else:
            array = np.zeros(count, dtype=numpy_dtype(datatype))
        arrays[name] = array.reshape(dims)
    return arrays


def _random(rng: np.random.Generator, datatype: str, count: int) -> np.ndarray:
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, 100, count).astype(dtype)
    return rng.random(count).astype(np.float32).astype(dtype)


def run_warmup(loaded: LoadedModel, spec_json: dict[str, Any], model_dir: Path) -> None:
    """Run every warmup entry `count` times (at least once) on every instance; raises on failure."""
    spec = loaded.spec
    names = [o.name for o in spec.outputs]
    for warmup in spec_json.get("model_warmup", []):
        sample = warmup_inputs(spec_json, warmup, model_dir)
        batch = max(1, int(warmup.get("batch_size", 1)))
        if spec.max_batch_size > 0:
            sample = {k: np.repeat(v[np.newaxis], batch, axis=0) for k, v in sample.items()}
        elif batch != 1:
            raise invalid(
                f"warmup '{warmup.get('name', '')}' of non-batching model '{spec.model_name}' has batch_size {batch}"
            )
        for instance in loaded.instances:
            for _ in range(max(1, int(warmup.get("count", 0)))):
                for result in instance.runner.execute(Batch([Work(sample, names, batch)])):
                    if isinstance(result, ModelError):
                        raise ShoalError(result.message, result.code)

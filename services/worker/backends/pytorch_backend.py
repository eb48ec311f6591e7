"""The PyTorch backend: TorchScript `model.pt` files (`platform: "pytorch_libtorch"`, `backend: "pytorch"`),
and PyTorch 2 programs (`model.pt2`, `platform: "torch_aoti"`: `pt2_backend`), chosen by the platform as in Triton.

One `torch.jit.load`ed module per instance, run under `torch.inference_mode()` on the
instance's own thread. KIND_CPU instances run on the CPU, KIND_GPU instances on
`cuda:<gpu>` (inputs copied to the device, outputs back to the host); KIND_MODEL leaves
placement to the model. Names bind as Triton's libtorch backend binds them (`torch_names`).
BYTES inputs reach the model as `List[str]` (flattened, UTF-8), a `List[str]` result
comes back as BYTES, as in Triton.

Config `parameters` read, as Triton names them: INTRA_OP_THREAD_COUNT,
INTER_OP_THREAD_COUNT, INFERENCE_MODE (default true), DISABLE_OPTIMIZED_EXECUTION.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from services.worker.backends import Backend, Placement
from services.worker.backends.pt2_backend import Pt2Instance
from services.worker.backends.runner import BatchedRunner
from services.worker.backends.torch_names import bind_inputs, bind_outputs
from services.worker.backends.torch_tensors import flag, to_numpy, to_torch, torch_device
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError, invalid, unavailable

log = logging.getLogger("shoal.worker")
_inter_op_set = False  # torch allows setting the inter-op pool size once per process


class TorchInstance(BatchedRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        super().__init__(spec)
        kind, name = placement.kind, placement.name
        self.device = torch_device(kind, placement.device)
        parameters = spec.parameters
        self.threads = int(parameters.get("INTRA_OP_THREAD_COUNT", "0") or 0) or placement.threads
        # torch's intra-op pool size is process-wide (checked: a set in one thread applies to all):
        # the latest model loaded sets it, to its per-instance share of the worker's cores
        torch.set_num_threads(max(1, self.threads))
        self._set_inter_op(int(parameters.get("INTER_OP_THREAD_COUNT", "0") or 0))
        self.inference_mode = flag(parameters.get("INFERENCE_MODE", ""), True)
        self.optimized = not flag(parameters.get("DISABLE_OPTIMIZED_EXECUTION", ""), False)
        try:
            self.module = torch.jit.load(str(path), map_location=self.device if kind != "KIND_MODEL" else None)
        except Exception as exc:  # not a TorchScript archive, or saved from an incompatible torch
            raise unavailable(f"unable to load TorchScript model '{spec.model_name}' from {path}: {exc}") from None
        self.module.eval()
        arguments = [a.name for a in self.module.forward.schema.arguments][1:]  # without `self`
        # batch inputs follow the config's inputs, as in Triton's PyTorch backend
        names = [t.name for t in spec.inputs] + [t for rule in self.batch_inputs for t in rule.targets]
        self.inputs = bind_inputs(spec.name, names, arguments)
        self.outputs = bind_outputs([t.name for t in spec.outputs])
        log.info(
            "model '%s' instance '%s' on %s: inputs by %s (forward%s)",
            spec.name,
            name or spec.name,
            self.device,
            self.inputs.convention,
            tuple(arguments),
        )

    @staticmethod
    def _set_inter_op(count: int) -> None:
        global _inter_op_set
        if count > 0 and not _inter_op_set:
            try:
                torch.set_num_interop_threads(count)
                _inter_op_set = True
            except RuntimeError as exc:  # already started: the first model's setting stays
                log.warning("INTER_OP_THREAD_COUNT %d not applied: %s", count, exc)

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        tensors = {name: to_torch(array, self.device) for name, array in inputs.items()}
        args, kwargs = self.inputs.arguments(tensors)
        grad = torch.inference_mode() if self.inference_mode else torch.no_grad()
        with grad, torch.jit.optimized_execution(self.optimized):
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    result = self.module(*args, **kwargs)
                    torch.cuda.current_stream().synchronize()
            else:
                result = self.module(*args, **kwargs)
            outputs = {name: to_numpy(self._pick(result, name), name) for name in output_names}
        return {
            name: self._shape_strings(name, array, inputs) if array.dtype == object else array
            for name, array in outputs.items()
        }

    def _shape_strings(self, name: str, array: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """A `List[str]` result is flat: give it the config's shape (with the batch), as Triton does."""
        tensor = self.spec.output(name)
        if tensor is None or tensor.variable:
            return array
        lead = [next(iter(inputs.values())).shape[0]] if self.spec.max_batch_size > 0 and inputs else []
        shape = lead + list(tensor.reshape if tensor.reshape is not None else tensor.dims)
        if int(np.prod(shape)) != array.size:
            raise ShoalError(f"output '{name}' has {array.size} strings, expected shape {shape}", Code.INTERNAL)
        return array.reshape(shape)

    def _pick(self, result: Any, name: str) -> Any:
        if isinstance(result, dict):
            if name not in result:
                raise ShoalError(
                    f"the model returned no output '{name}' (it returned {', '.join(map(str, result))})", Code.INTERNAL
                )
            return result[name]
        index = self.outputs.get(name)
        if index is None:
            raise invalid(f"unexpected inference output '{name}' for model '{self.spec.model_name}'")
        if isinstance(result, torch.Tensor) or (isinstance(result, list) and result and isinstance(result[0], str)):
            result = (result,)  # a lone tensor (or string list) is output 0
        if not isinstance(result, (tuple, list)) or index >= len(result):
            count = len(result) if isinstance(result, (tuple, list)) else 1
            raise ShoalError(
                f"output '{name}' maps to index {index} but the model returned {count} output(s)", Code.INTERNAL
            )
        return result[index]

    def close(self) -> None:
        del self.module
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def instance(spec: ModelSpec, path: Path, placement: Placement) -> BatchedRunner:
    """Triton's PyTorch backend picks the PT2 runtime by the platform alone (`torch_aoti`)."""
    factory = Pt2Instance if spec.platform == "torch_aoti" else TorchInstance
    return factory(spec, path, placement)


BACKEND = Backend("model.pt", instance, shares_cores=True)

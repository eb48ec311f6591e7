"""The PyTorch backend's PyTorch 2 programs: `model.pt2` under `platform: "torch_aoti"`.

As Triton's PyTorch backend (PT2 support) loads them: an AOTInductor package
(`torch._inductor.aoti_compile_and_package`), run through its compiled loader. Beyond Triton,
a `torch.export.save`d ExportedProgram (no compiled code in it) runs through its module, so a
model exported on a host without a C++ compiler serves too. Either way the program's call
specification names its inputs and outputs (`pt2_names`); requests are gathered into one batch
along dimension 0, as Triton does, which a program exported with a dynamic batch dimension takes.

Config `parameters` read: INFERENCE_MODE (default true). Error texts are Triton's.
"""

from __future__ import annotations

import logging
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from services.worker.backends import Placement
from services.worker.backends.pt2_names import Tree, bind, bind_all_inputs, input_interface, output_interface
from services.worker.backends.runner import BatchedRunner
from services.worker.backends.torch_tensors import flag, to_numpy, to_torch, torch_device
from shared.config.datatypes import protocol_dtype
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError, unavailable

log = logging.getLogger("shoal.worker")
Program = Callable[[list[Any]], list[Any]]
# loading imports torch.export's and inductor's modules on first use, which is not thread-safe: models
# loaded at once on the worker's threads saw partially initialised torch._dynamo modules
_LOADING = threading.Lock()


def is_aoti_package(path: Path) -> bool:
    """An AOTInductor package holds compiled code under `<model>/data/aotinductor/`; an
    ExportedProgram only its serialized graph."""
    with zipfile.ZipFile(path) as archive:
        return any("/data/aotinductor/" in name for name in archive.namelist())


def tree(spec: pytree.TreeSpec) -> Tree:
    if spec.is_leaf():
        return None
    children = [tree(child) for child in spec.children()]
    if issubclass(spec.type, dict):
        return {str(key): child for key, child in zip(spec.context, children, strict=True)}
    if issubclass(spec.type, (tuple, list)):
        return children
    raise TypeError(f"{spec.type.__name__} in the call specification: only dict, tuple, list and tensors are supported")


def load(path: Path, device: torch.device) -> tuple[Program, pytree.TreeSpec, pytree.TreeSpec, str]:
    """The program's flat call, its input and output specifications, and what it is."""
    if is_aoti_package(path):
        from torch._inductor import aoti_load_package  # heavy: only where a package is loaded

        package: Any = aoti_load_package(str(path), device_index=device.index if device.type == "cuda" else -1)
        in_spec, out_spec = (pytree.treespec_loads(s) for s in package.loader.get_call_spec())
        return package.loader.run, in_spec, out_spec, "AOTInductor package"
    program = torch.export.load(str(path))
    module = program.module().to(device)
    in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
    if in_spec is None or out_spec is None:
        raise ValueError("the ExportedProgram has no call specification")

    def run(flat: list[Any]) -> list[Any]:
        args, kwargs = pytree.tree_unflatten(flat, in_spec)
        return list(pytree.tree_leaves(module(*args, **kwargs)))

    return run, in_spec, out_spec, "ExportedProgram"


class Pt2Instance(BatchedRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        super().__init__(spec)
        self.instance = placement.name or spec.name
        self.device = torch_device(placement.kind, placement.device)
        self.inference_mode = flag(spec.parameters.get("INFERENCE_MODE", ""), True)
        torch.set_num_threads(max(1, int(spec.parameters.get("INTRA_OP_THREAD_COUNT", "0") or 0) or placement.threads))
        try:
            with _LOADING:
                self.program, in_spec, out_spec, what = load(path, self.device)
            if len(in_spec.children()) != 2:
                raise ValueError("the input call specification is not tuple[tuple, dict]")
            args, kwargs = (tree(s) for s in in_spec.children())
            result = tree(out_spec)
        except Exception as exc:  # not a PT2 archive, built by another torch, or for another device
            raise unavailable(
                f'failed to create instance "{self.instance}" for inductor model "{spec.name}": '
                f'Failed to create ModelInstanceState for model "{spec.name}": {exc}'
            ) from None
        self.inputs_of = input_interface(args, kwargs)
        self.outputs_of = output_interface(result)
        names = [t.name for t in spec.inputs] + [t for rule in self.batch_inputs for t in rule.targets]
        self.inputs = bind_all_inputs(spec.name, names, self.inputs_of)
        self.outputs = bind(spec.name, "output", [t.name for t in spec.outputs], self.outputs_of)
        log.info(
            "model '%s' instance '%s' (%s) on %s: (%s) -> (%s)",
            spec.name,
            self.instance,
            what,
            self.device,
            ", ".join(self.inputs_of.names),
            ", ".join(self.outputs_of.names),
        )

    def run(self, inputs: dict[str, Any], output_names: list[str]) -> dict[str, Any]:
        flat: list[Any] = [None] * len(self.inputs_of.names)
        for name, array in inputs.items():
            flat[self.inputs[name]] = to_torch(array, self.device)
        grad = torch.inference_mode() if self.inference_mode else torch.no_grad()
        try:
            with grad:
                results = self.program(flat)
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
        except Exception as exc:
            raise ShoalError(
                f'Inductor model instance "{self.instance}" execution failure: {exc}', Code.INTERNAL
            ) from None
        return {name: self._output(name, results) for name in output_names}

    def _output(self, name: str, results: list[Any]) -> Any:
        index = self.outputs.get(name, self.outputs_of.position(name))
        if index is None or index >= len(results):
            raise ShoalError(
                f'Inductor model instance "{self.instance}" output tensor "{name}" not found in output map.',
                Code.INTERNAL,
            )
        value = results[index]
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            raise ShoalError(
                f'Inductor model instance "{self.instance}" output tensor "{name}" is a scalar which is not supported.',
                Code.INTERNAL,
            )
        array = to_numpy(value, name)
        tensor = self.spec.output(name)
        datatype = protocol_dtype(array.dtype)
        if tensor is not None and datatype != tensor.datatype:
            raise ShoalError(
                f'Inductor model instance "{self.instance}" output tensor "{name}" has datatype TYPE_{datatype} '
                f"but model configuration expects TYPE_{tensor.datatype}.",
                Code.INTERNAL,
            )
        return array

    def close(self) -> None:
        del self.program
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

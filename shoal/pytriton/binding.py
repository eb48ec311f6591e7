"""One `Triton.bind`: the generated model config and the handlers that call the bound functions.

The worker hands a handler the batch's requests (`CallRequest`s); the handler calls the
function with PyTriton's `Request`s, checks what it returns as PyTriton does, and turns
PyTriton's exceptions into Triton errors: `PyTritonValidationError` is the client's fault
(INVALID_ARG, a 400), anything else an INTERNAL error (500); `PyTritonUnrecoverableError`
also stops this process's serving, as in PyTriton.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from services.worker.python.hosting.callables import IN_PROCESS, CallRequest
from shared.errors import Code, ShoalError
from shoal.pytriton.decorators import TritonContext
from shoal.pytriton.exceptions import PyTritonUnrecoverableError, PyTritonValidationError
from shoal.pytriton.model_config.common import DeviceKind
from shoal.pytriton.model_config.generator import ModelConfigGenerator
from shoal.pytriton.model_config.model_config import ModelConfig
from shoal.pytriton.model_config.tensor import Tensor
from shoal.pytriton.model_config.triton_model_config import ResponseCache, TensorSpec, TritonModelConfig
from shoal.pytriton.proxy.types import Request

Results = list[dict[str, np.ndarray]]


def _specs(tensors: Sequence[Tensor], prefix: str) -> list[TensorSpec]:
    """PyTriton's default names: INPUT_1, INPUT_2, ... / OUTPUT_1, ... for unnamed tensors."""
    return [
        TensorSpec(name=t.name or f"{prefix}_{i}", shape=tuple(t.shape), dtype=t.dtype, optional=t.optional)
        for i, t in enumerate(tensors, start=1)
    ]


def triton_model_config(name: str, version: int, functions: int, inputs, outputs, config: ModelConfig):
    triton_config = TritonModelConfig(
        model_name=name,
        model_version=version,
        batching=config.batching,
        batcher=config.batcher,
        max_batch_size=config.max_batch_size,
        decoupled=config.decoupled,
        instance_group={DeviceKind.KIND_CPU: functions},
        inputs=_specs(inputs, "INPUT"),
        outputs=_specs(outputs, "OUTPUT"),
        response_cache=ResponseCache(enable=True) if config.response_cache else None,
    )
    # what the config says apart from Shoal's marker fingerprints it: a process joining a cluster
    # where the same binding is loaded already serves it as it is, without a reload
    fingerprint = hashlib.sha256(json.dumps(ModelConfigGenerator(triton_config).get_config()).encode()).hexdigest()
    triton_config.backend_parameters = {IN_PROCESS: f"pytriton sha256:{fingerprint[:16]}"}
    return triton_config


def _error(exc: Exception) -> ShoalError:
    if isinstance(exc, ShoalError):
        return exc
    if isinstance(exc, PyTritonValidationError):
        return ShoalError(str(exc), Code.INVALID_ARG)
    return ShoalError(f"{type(exc).__name__}: {exc}", Code.INTERNAL)


class Binding:
    def __init__(
        self,
        name: str,
        version: int,
        infer_func: Callable | Sequence[Callable],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig,
        context: TritonContext,
        strict: bool,
        on_unrecoverable: Callable[[Exception], None],
    ) -> None:
        functions = [infer_func] if callable(infer_func) else list(infer_func)
        if not functions or not all(callable(f) for f in functions):
            raise PyTritonValidationError("inference_fn has to be either callable or sequence of callables")
        if any(output.optional for output in outputs):
            raise PyTritonValidationError("Output tensors cannot be optional.")
        self.name, self.version, self.functions, self.strict = name, version, functions, strict
        self.model_config = config
        self.on_unrecoverable = on_unrecoverable
        self.triton_config = triton_model_config(name, version, len(functions), inputs, outputs, config)
        self.outputs = {spec.name: spec for spec in self.triton_config.outputs or []}
        for function in functions:  # what @triton_context, @batch and friends read
            context.model_configs[function] = copy.deepcopy(self.triton_config)
            target: Any = function.__self__ if hasattr(function, "__self__") else function
            target.__triton_context__ = context

    def config(self) -> dict:
        return ModelConfigGenerator(self.triton_config).get_config()

    def config_text(self) -> str:
        return ModelConfigGenerator(self.triton_config).to_text()

    # -- the worker's side -------------------------------------------------------------
    def handler(self, index: int) -> Callable[[list[CallRequest]], Any]:
        function = self.functions[index % len(self.functions)]
        return lambda requests: self._call(function, requests)

    def _call(self, function: Callable, calls: list[CallRequest]) -> Results | Iterator[Results]:
        requests = [Request(dict(call.inputs), dict(call.parameters)) for call in calls]
        try:
            result = function(requests)
        except Exception as exc:
            raise self._fail(exc) from exc
        if self.model_config.decoupled:
            if not inspect.isgenerator(result) and not isinstance(result, Iterator):
                raise ShoalError(
                    f"the inference function of decoupled model '{self.name}' must be a generator", Code.INTERNAL
                )
            return self._stream(result)
        return self._results(result)

    def _stream(self, generator: Iterator[Any]) -> Iterator[Results]:
        try:
            for item in generator:
                yield self._results(item)
        except Exception as exc:
            raise self._fail(exc) from exc

    def _fail(self, exc: Exception) -> ShoalError:
        if isinstance(exc, PyTritonUnrecoverableError):
            self.on_unrecoverable(exc)
        return _error(exc)

    def _results(self, outputs: Any) -> Results:
        """PyTriton's checks of what a function returns; unicode arrays are sent as UTF-8 bytes."""
        if not isinstance(outputs, list) or not all(isinstance(r, dict) for r in outputs):
            raise ShoalError(
                f"Outputs returned by `{self.name}` model callable must be list of response dicts with numpy arrays",
                Code.INTERNAL,
            )
        return [{name: self._output(name, value) for name, value in response.items()} for response in outputs]

    def _output(self, name: Any, value: Any) -> np.ndarray:
        if not isinstance(name, str):
            raise ShoalError(f"Not all keys returned by `{self.name}` model callable are string", Code.INTERNAL)
        if not isinstance(value, np.ndarray):
            raise ShoalError(f"Not all values returned by `{self.name}` model callable are numpy arrays", Code.INTERNAL)
        if value.dtype.kind not in "biufOSU":
            raise ShoalError(
                "Only bool, numeric, string, unicode and object arrays are supported by Triton (dtype.kind: biufOSU). "
                f"Returned `{name}` for model `{self.name}` has `{value.dtype.kind}` dtype.kind.",
                Code.INTERNAL,
            )
        if value.dtype.kind == "O" and value.size and not isinstance(value.item(0), bytes):
            raise ShoalError(
                f"Only bytes as objects dtype are supported by PyTriton. Returned `{name}` from `{self.name}` "
                f"has `{type(value.item(0))}` type.",
                Code.INTERNAL,
            )
        if self.strict:
            self._check_strict(name, value)
        if value.dtype.kind == "U":
            value = np.char.encode(value, "utf-8")
        return value

    def _check_strict(self, name: str, value: np.ndarray) -> None:
        spec = self.outputs.get(name)
        if spec is None:
            raise ShoalError(
                f"Returned output `{name}` is not defined in model config for model `{self.name}`.", Code.INTERNAL
            )
        bytes_types = (bytes, object, np.bytes_, np.object_)
        text = value.dtype.kind in "OSU"
        if (not text and not np.issubdtype(value.dtype, spec.dtype)) or (text and spec.dtype not in bytes_types):
            raise ShoalError(
                f"Returned output `{name}` for model `{self.name}` has invalid type. "
                f"Returned: {value.dtype} ({value.dtype.kind}). Expected: {spec.dtype}.",
                Code.INTERNAL,
            )
        shape = value.shape[1:] if self.model_config.batching else value.shape
        if len(shape) != len(spec.shape) or any(x != y != -1 for x, y in zip(shape, spec.shape)):
            raise ShoalError(
                f"Returned output `{name}` for model `{self.name}` has invalid shapes. "
                f"Returned: {shape}. Expected: {spec.shape}.",
                Code.INTERNAL,
            )

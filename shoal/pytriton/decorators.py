"""PyTriton's inference-function decorators, with PyTriton's semantics.

An undecorated function takes the batch's requests (a list of dict-like `Request`s, one per
client request) and returns one dict of outputs per request. `@batch` concatenates the
requests' inputs along the batch axis, calls the function with them as keyword arguments and
splits its outputs back per request (also for each item a decoupled generator yields).

The decorators are `wrapt` decorators, as in PyTriton: `Triton.bind` sets the model's
`TritonContext` on the function, and any layer of the stack reaches it and the model config.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import operator
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import numpy as np
import wrapt

from shoal.pytriton.exceptions import PyTritonBadParameterError, PyTritonRuntimeError, PyTritonValidationError
from shoal.pytriton.model_config.triton_model_config import TritonModelConfig

TRITON_CONTEXT_FIELD_NAME = "triton_context"
_SPECIAL_KEYS = ["__triton_context__"]

InferenceRequest = dict[str, np.ndarray]
InferenceResult = dict[str, np.ndarray]


class ModelConfigDict(MutableMapping):
    """Model configs by inference function (every decorator layer of one function is one key)."""

    def __init__(self) -> None:
        self._data: dict[str, TritonModelConfig] = {}
        self._keys: list[Callable] = []

    @staticmethod
    def _key(infer_callable: Callable) -> str:
        key: Any = infer_callable
        if inspect.ismethod(key) and key.__name__ == "__call__":
            key = key.__self__
        return str(key)

    def __getitem__(self, infer_callable: Callable) -> TritonModelConfig:
        return self._data[self._key(infer_callable)]

    def __setitem__(self, infer_callable: Callable, item: TritonModelConfig) -> None:
        self._keys.append(infer_callable)
        self._data[self._key(infer_callable)] = item

    def __delitem__(self, infer_callable: Callable) -> None:
        del self._data[self._key(infer_callable)]

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Callable]:
        return iter(self._keys)


@dataclasses.dataclass
class TritonContext:
    model_configs: ModelConfigDict = dataclasses.field(default_factory=ModelConfigDict)


def get_triton_context(wrapped: Callable, instance: Any) -> TritonContext:
    caller = instance or wrapped
    if not hasattr(caller, "__triton_context__"):
        raise PyTritonValidationError("Wrapped function or object must bound with triton to get  __triton_context__")
    return caller.__triton_context__


def get_model_config(wrapped: Callable, instance: Any) -> TritonModelConfig:
    return get_triton_context(wrapped, instance).model_configs[wrapped]


def get_inference_request_batch_size(inference_request: InferenceRequest) -> int:
    return next(iter(inference_request.values())).shape[0]


def convert_output(outputs: Any, wrapped: Callable | None = None, instance: Any = None, model_config=None) -> dict:
    """A dict of outputs as is; a list or tuple mapped in order onto the config's outputs."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        config = model_config or get_model_config(wrapped, instance)  # type: ignore[arg-type]
        specs = list(config.outputs or [])
        if len(outputs) != len(specs):
            raise PyTritonValidationError("Outputs length different than config outputs length")
        return {spec.name: output for spec, output in zip(specs, outputs)}
    raise PyTritonValidationError(f"Unsupported output type {type(outputs)}.")


def _wrapper_stack(wrapped: Any) -> list[Any]:
    stack, current = [], wrapped
    while current is not None:
        stack.append(getattr(current, "_self_wrapper", None))
        current = getattr(current, "__wrapped__", None)
    return [w for w in stack if w is not None]


@wrapt.decorator
def sample(wrapped, instance, args, kwargs):
    """Non-batching models: the first request's inputs as keyword arguments, the result as a one-item list."""
    kwargs.update(args[0][0])
    return [convert_output(wrapped(*args[1:], **kwargs), wrapped, instance)]


@wrapt.decorator
def batch(wrapped, instance, args, kwargs):
    """The requests' inputs concatenated per name, as keyword arguments; outputs split back per request."""
    requests = args[0]
    names = requests[0].keys()
    for request in requests[1:]:
        if names != request.keys():
            raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
    inputs = {name: np.concatenate([request[name] for request in requests]) for name in names}
    outputs = wrapped(*args[1:], **{**kwargs, **inputs})
    sizes = [get_inference_request_batch_size(request) for request in requests]

    def split(result: Any) -> list[InferenceResult]:
        result = convert_output(result, wrapped, instance)
        total = sum(sizes)
        wrong = {name: tensor.shape for name, tensor in result.items() if tensor.shape[0] != total}
        if wrong:
            shapes = ", ".join(f"{name}: {shape}" for name, shape in wrong.items())
            raise ValueError(
                f"Received output tensors with different batch sizes: {shapes}. Expected batch size: {total}. "
            )
        bounds = list(itertools.accumulate(sizes, initial=0))
        return [{name: tensor[a:b, ...] for name, tensor in result.items()} for a, b in zip(bounds, bounds[1:])]

    if inspect.isgenerator(outputs):
        return (split(result) for result in outputs)
    return split(outputs)


def _value_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype == np.object_ or value.dtype.type == np.bytes_:
            return tuple(bytes(item) for item in value.reshape(-1)) + value.shape
        return value.tobytes()
    return value


def group_by_values(*keys: str, pad_fn: Callable | None = None):
    """Split a batch (after `@batch`) into sub-batches of equal values of `keys`; one call each."""

    def group(request: InferenceRequest, size: int):
        indexed = sorted(
            ((i, tuple(_value_key(request[key][i]) for key in keys)) for i in range(size)), key=operator.itemgetter(1)
        )
        for _, members in itertools.groupby(indexed, key=operator.itemgetter(1)):
            indices = tuple(i for i, _ in members)
            yield indices, {name: value[indices, ...] for name, value in request.items()}

    @wrapt.decorator
    def wrapper(wrapped, instance, args, kwargs):
        if batch in _wrapper_stack(wrapped):
            raise PyTritonRuntimeError("The @group_by_values decorator must be used after the @batch decorator.")
        request = {k: v for k, v in kwargs.items() if k not in _SPECIAL_KEYS}
        special = {k: v for k, v in kwargs.items() if k in _SPECIAL_KEYS}
        size = get_inference_request_batch_size(request)
        pieces = [(indices, wrapped(*args, **sub, **special)) for indices, sub in group(request, size)]
        if pad_fn is not None:
            padded = pad_fn(tuple(result for _, result in pieces))
            pieces = [(indices, result) for (indices, _), result in zip(pieces, padded)]
        first = pieces[0][1]
        merged = {name: np.zeros((size,) + data.shape[1:], dtype=data.dtype) for name, data in first.items()}
        for indices, result in pieces:
            for name, data in result.items():
                merged[name][indices, ...] = data
        return merged

    return wrapper


class ConstantPadder:
    """Pads each output of the sub-batches to a common shape with a constant, so they merge."""

    def __init__(self, pad_value: Any = 0) -> None:
        self.pad_value = pad_value

    @staticmethod
    def _dtype(arrays: list[np.ndarray]) -> np.dtype:
        dtypes = [a.dtype for a in arrays]
        if not all(d.kind == dtypes[0].kind for d in dtypes):
            raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
        if dtypes[0].kind in "SU":  # fixed-width strings: the longest width holds them all
            return np.dtype(f"{dtypes[0].str[:2]}{max(int(d.str[2:]) for d in dtypes)}")
        if not all(d == dtypes[0] for d in dtypes):
            raise PyTritonRuntimeError("All input arrays for given input name must have the same dtype.")
        return dtypes[0]

    def __call__(self, batches_list):
        names = list(OrderedDict.fromkeys(name for batch in batches_list for name in batch))
        by_name = {name: [batch.get(name) for batch in batches_list] for name in names}
        for arrays in by_name.values():
            present = [a for a in arrays if a is not None]
            shape = tuple(np.max([a.shape[1:] for a in present], axis=0))
            dtype = self._dtype(present)
            value = b"" if dtype.kind in "SUO" else self.pad_value
            for i, array in enumerate(arrays):
                if array is not None:
                    widths = [(0, 0)] + [(0, b - a) for a, b in zip(array.shape[1:], shape)]
                    arrays[i] = np.pad(array, widths, mode="constant", constant_values=value).astype(dtype)
        return [
            {name: arrays[i] for name, arrays in by_name.items() if arrays[i] is not None}
            for i in range(len(batches_list))
        ]


@wrapt.decorator
def group_by_keys(wrapped, instance, args, kwargs):
    """Call the function once per group of requests with the same set of input names (results in order)."""
    requests = args[0]
    indexed = sorted(
        ((i, tuple(sorted(request.keys())), request) for i, request in enumerate(requests)), key=operator.itemgetter(1)
    )
    results = []
    for _, members in itertools.groupby(indexed, key=operator.itemgetter(1)):
        indices, _, group = zip(*members)
        results.extend(zip(indices, wrapped(list(group), *args[1:], **kwargs)))
    return [result for _, result in sorted(results, key=operator.itemgetter(0))]


def fill_optionals(**defaults: np.ndarray):
    """Fill inputs missing from a request with defaults (arrays without the batch axis)."""

    def verify(config: TritonModelConfig) -> None:
        inputs = {spec.name: spec for spec in config.inputs or []}
        unknown = sorted(set(defaults) - set(inputs))
        if unknown:
            raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")
        not_numpy = [f"{k}={v}" for k, v in defaults.items() if not isinstance(v, np.ndarray)]
        if not_numpy:
            raise PyTritonBadParameterError(
                f"Could not use {', '.join(not_numpy)} defaults as they are not NumPy arrays"
            )
        wrong_dtypes = [
            f"{k}: dtype={v.dtype} expected_dtype={inputs[k].dtype}"
            for k, v in defaults.items()
            if v.dtype != inputs[k].dtype
        ]
        if wrong_dtypes:
            raise PyTritonBadParameterError(
                f"Could not use {', '.join(wrong_dtypes)} defaults as they have different than input signature dtypes"
            )

        def matches(have: tuple, expected: tuple) -> bool:
            return len(have) == len(expected) and all(e == -1 or h == e for h, e in zip(have, expected))

        wrong_shapes = [
            f"{k}: shape={v.shape} expected_shape={inputs[k].shape}"
            for k, v in defaults.items()
            if not matches(v.shape, tuple(inputs[k].shape))
        ]
        if wrong_shapes:
            raise PyTritonBadParameterError(
                f"Could not use {', '.join(wrong_shapes)} defaults as they have different than input signature shapes"
            )

    @wrapt.decorator
    def wrapper(wrapped, instance, args, kwargs):
        config = get_model_config(wrapped, instance)
        verify(config)
        (requests,) = args
        for request in requests:
            size = get_inference_request_batch_size(request) if config.batching else None
            for name, value in defaults.items():
                if name not in request:
                    request[name] = np.tile(value, (size,) + (1,) * value.ndim) if config.batching else value
        return wrapped(*args, **kwargs)

    return wrapper


@wrapt.decorator
def triton_context(wrapped, instance, args, kwargs):
    """Pass the model's `TritonContext` as the `triton_context` keyword argument."""
    kwargs[TRITON_CONTEXT_FIELD_NAME] = get_triton_context(wrapped, instance)
    return wrapped(*args, **kwargs)


@wrapt.decorator
def pad_batch(wrapped, instance, args, kwargs):
    """Repeat the last row up to the nearest preferred batch size (or the max batch size)."""
    inputs = {k: v for k, v in kwargs.items() if k not in _SPECIAL_KEYS}
    config = get_model_config(wrapped, instance)
    preferred = config.batcher.preferred_batch_size if config.batcher is not None else None
    sizes = sorted(preferred or []) + [config.max_batch_size]
    current = next(iter(inputs.values())).shape[0]
    target = sizes[bisect_left(sizes, current)]
    for name, array in inputs.items():
        repeats = np.ones(array.shape[0], dtype=np.int64)
        repeats[-1] = target - array.shape[0] + 1
        kwargs[name] = np.repeat(array, repeats, axis=0)
    return wrapped(*args, **kwargs)


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True):
    """Replace the named inputs by their first value (checked equal across the batch when strict)."""
    not_allowed = [key for key in keys if key in _SPECIAL_KEYS]
    if not_allowed:
        raise PyTritonBadParameterError(
            f"The keys {', '.join(not_allowed)} are not allowed as keys for @first_value wrapper. "
            f"The set of not allowed keys are {', '.join(_SPECIAL_KEYS)}"
        )

    def replace(request):
        for name in keys:
            if name not in request:
                continue
            values = request[name]
            if strict and len(np.unique(values, axis=None if values.dtype == object else 0)) > 1:
                raise PyTritonRuntimeError(
                    f"The values on the {name!r} input are not equal. "
                    "To proceed, either disable strict mode in @first_value wrapper "
                    "or ensure that the values always are consistent. "
                    f"The current values of {name!r} are {request[name]!r}."
                )
            first = values[0]
            if squeeze_single_values and not np.isscalar(first) and all(dim == 1 for dim in first.shape):
                first = np.squeeze(first)[()]
            request[name] = first
        return request

    @wrapt.decorator
    def wrapper(wrapped, instance, args, kwargs):
        if not get_model_config(wrapped, instance).batching:
            raise PyTritonRuntimeError("The @first_value decorator can only be used with models that support batching.")
        if set(kwargs) - set(_SPECIAL_KEYS):
            return wrapped(*args, **replace(kwargs))
        requests, *rest = args
        return wrapped([replace(request) for request in requests], *rest, **kwargs)

    return wrapper

"""Triton's generate extension (`/generate`, `/generate_stream`): flat JSON in, flat JSON out.

Pure conversions (docs/triton-spec.md §1.8): a request's top-level keys become input tensors when
the model has an input of that name and request parameters otherwise; a response becomes
one flat object with every output keyed by name (one-element tensors as scalars).
"""

from __future__ import annotations

from typing import Any

import orjson

from inference.types import InputTensor, OutputTensor, ParsedRequest
from services.gateway.http.codec import json_values
from services.gateway.http.json_data import json_tensor_bytes
from shared.config.model_config import ModelSpec, TensorSpec
from shared.errors import invalid

_PARAMETER_TYPES = (str, int, float, bool)


def parse_generate(spec: ModelSpec, body: Any) -> ParsedRequest:
    if not isinstance(body, dict):
        raise invalid("generate request must be a JSON object")
    request_id = body.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("Unable to parse 'id': attempt to access JSON non-string as string")
    nested = body.get("parameters", {})
    if not isinstance(nested, dict):
        raise invalid("Unable to parse 'parameters': attempt to access JSON non-object as object")
    top = {k: v for k, v in body.items() if k not in ("id", "parameters")}
    both = sorted(set(top) & set(nested))
    if both:
        raise invalid(f"'{both[0]}' is given both as a top-level key and in 'parameters' of the generate request")
    inputs: list[InputTensor] = []
    parameters: dict[str, Any] = {}
    for key, value in {**top, **nested}.items():
        config = spec.input(key)
        if config is not None:
            inputs.append(_tensor(spec, config, value))
        elif isinstance(value, _PARAMETER_TYPES):
            parameters[key] = value
        else:
            raise invalid(f"parameter '{key}' of the generate request must be a string, number or boolean")
    return ParsedRequest(request_id, inputs, None, parameters)


def _tensor(spec: ModelSpec, config: TensorSpec, value: Any) -> InputTensor:
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, (list, dict)) for v in values):
        raise invalid(f"input '{config.name}' of the generate request must be a scalar or a 1-D array")
    dims = list(config.dims)
    fixed = 1
    for d in dims:
        fixed *= d if d > 0 else 1
    if -1 in dims:  # the remaining count goes into the innermost variable dimension, others are 1
        inner = len(dims) - 1 - dims[::-1].index(-1)
        dims = [1 if d == -1 else d for d in dims]
        dims[inner] = len(values) // fixed if fixed else 0
    shape = ([1] if spec.max_batch_size > 0 else []) + dims
    return InputTensor(
        config.name, config.datatype, shape, json_tensor_bytes(config.name, config.datatype, shape, values)
    )


def render_generate(
    model: str, version: int, request_id: str, outputs: list[OutputTensor], parameters: dict[str, Any]
) -> bytes:
    doc: dict[str, Any] = {}
    if request_id:
        doc["id"] = request_id
    doc["model_name"] = model
    doc["model_version"] = str(version)
    doc.update(parameters or {})
    for out in outputs:
        if out.data is None:  # generate requests name no shared-memory outputs
            continue
        values = json_values(out.datatype, out.shape, out.data)
        values = values.tolist() if hasattr(values, "tolist") else values
        doc[out.name] = values[0] if len(values) == 1 else values
    return orjson.dumps(doc)


def event(payload: bytes) -> bytes:
    """One server-sent event."""
    return b"data: " + payload + b"\n\n"

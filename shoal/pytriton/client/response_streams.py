"""The response streams of `DecoupledModelClient`: a gRPC stream, or HTTP `/generate_stream`."""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import tritonclient.utils

from shoal.pytriton.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
)

_END = object()


def released(stream: Iterator[dict], lock: threading.Lock) -> Iterator[dict]:
    try:
        yield from stream
    finally:
        lock.release()


def grpc_stream(client: Any, inputs: list, outputs: list, request_id: str, timeout_s: float) -> Iterator[dict]:
    """One request on a gRPC bidirectional stream, up to its final (empty) response."""
    answers: queue.Queue = queue.Queue()

    def on_response(result: Any, error: Any) -> None:
        if error is not None:
            answers.put(error)
            return
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            answers.put(_END)
        else:
            answers.put({o.name: result.as_numpy(o.name) for o in result.get_response().outputs})

    infer_client = client._infer_client
    infer_client.start_stream(callback=on_response)
    try:
        infer_client.async_stream_infer(
            model_name=client._model_name,
            model_version=client._model_version or "",
            inputs=inputs,
            outputs=outputs,
            request_id=request_id,
            enable_empty_final_response=True,
        )
    except tritonclient.utils.InferenceServerException as exc:
        infer_client.stop_stream(cancel_requests=True)
        raise PyTritonClientInferenceServerError(
            f"Error occurred during inference request. Message: {exc.message()}"
        ) from exc
    return _drain(answers, timeout_s, lambda: infer_client.stop_stream(cancel_requests=False))


def _drain(answers: queue.Queue, timeout_s: float, close: Any) -> Iterator[dict]:
    try:
        while True:
            try:
                item = answers.get(timeout=timeout_s)
            except queue.Empty:
                raise PyTritonClientTimeoutError(
                    f"Timeout occurred during inference request. Timeout: {timeout_s} s"
                ) from None
            if item is _END:
                return
            if isinstance(item, Exception):
                message = item.message() if hasattr(item, "message") else str(item)
                raise PyTritonClientInferenceServerError(f"Error occurred during inference request. Message: {message}")
            yield item
    finally:
        close()


def _json_value(name: str, data: np.ndarray, batching: bool) -> Any:
    if batching:
        if data.shape[0] != 1:
            raise PyTritonClientValueError("over HTTP, DecoupledModelClient sends one sample per request (batch 1)")
        data = data[0]
    flat = data.reshape(-1)
    values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in flat.tolist()]
    return values[0] if data.ndim == 0 else values


def _array(value: Any, dims: tuple, batching: bool) -> np.ndarray:
    values = value if isinstance(value, list) else [value]
    array = np.array([v.encode("utf-8") if isinstance(v, str) else v for v in values], dtype=None)
    if array.dtype.kind == "S":
        array = array.astype(object)
    shape = list(dims)
    if shape.count(-1) == 1:
        array = array.reshape([d if d != -1 else -1 for d in shape])
    elif -1 not in shape and int(np.prod(shape)) == array.size:
        array = array.reshape(shape)
    return array[np.newaxis, ...] if batching else array


def http_stream(
    client: Any, inputs: dict[str, np.ndarray], parameters: dict | None, timeout_s: float
) -> Iterator[dict]:
    """One request on `/generate_stream` (server-sent events), each event one response."""
    config = client.model_config
    body = {name: _json_value(name, data, config.batching) for name, data in inputs.items()}
    if parameters:
        body["parameters"] = parameters
    version = f"/versions/{client._model_version}" if client._model_version else ""
    url = f"http://{client._triton_url.without_scheme}/v2/models/{client._model_name}{version}/generate_stream"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        message = json.loads(exc.read() or b"{}").get("error", str(exc))
        raise PyTritonClientInferenceServerError(
            f"Error occurred during inference request. Message: {message}"
        ) from exc
    except OSError as exc:
        raise PyTritonClientTimeoutError(f"Timeout occurred during inference request. Message: {exc}") from exc
    outputs = {spec.name: spec for spec in config.outputs or []}
    return _events(response, outputs, config.batching)


def _events(response: Any, outputs: dict, batching: bool) -> Iterator[dict]:
    with response:
        for line in response:
            if not line.startswith(b"data:"):
                continue
            doc = json.loads(line[5:])
            if "error" in doc:
                raise PyTritonClientInferenceServerError(
                    f"Error occurred during inference request. Message: {doc['error']}"
                )
            yield {name: _array(doc[name], spec.shape, batching) for name, spec in outputs.items() if name in doc}

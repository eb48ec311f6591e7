"""PyTriton's clients on tritonclient: `ModelClient`, `DecoupledModelClient`, `FuturesModelClient`
(and `AsyncioModelClient` from `asyncio_client`). They work against Shoal or any Triton.

    with ModelClient("localhost", "Linear") as client:
        result = client.infer_sample(np.array([1.0, 2.0], dtype=np.float32))

`infer_sample` adds the batch axis for batching models and removes it from the results;
`infer_batch` sends the arrays as they are. URLs: `host[:port]` or `http://`/`grpc://`.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http
import tritonclient.utils

from shoal.pytriton.client import response_streams
from shoal.pytriton.client.asyncio_client import AsyncioModelClient
from shoal.pytriton.client.exceptions import (
    PyTritonClientClosedError,
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
)
from shoal.pytriton.client.utils import (
    _DEFAULT_NETWORK_TIMEOUT_S,
    _DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S,
    TritonUrl,
    check_input,
    get_model_config,
    verify_inputs_args,
    verify_parameters,
    wait_for_model_ready,
    wait_for_server_ready,
)
from shoal.pytriton.model_config.triton_model_config import TritonModelConfig

DEFAULT_INFERENCE_TIMEOUT_S = 60.0

__all__ = ["AsyncioModelClient", "DecoupledModelClient", "FuturesModelClient", "ModelClient"]


class ModelClient:
    """Synchronous client of one model."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: TritonModelConfig | None = None,
        ensure_model_is_ready: bool = True,
    ) -> None:
        self._triton_url = TritonUrl.from_url(url)
        self._url = url
        self._model_name, self._model_version = model_name, model_version
        self._init_timeout_s = _DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S if init_timeout_s is None else init_timeout_s
        self._inference_timeout_s = DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else inference_timeout_s
        self._lib: Any = tritonclient.grpc if self._triton_url.scheme == "grpc" else tritonclient.http
        self._general_client: Any = self._create(min(_DEFAULT_NETWORK_TIMEOUT_S, self._init_timeout_s))
        self._infer_client: Any = self._create(self._inference_timeout_s)
        self._model_config = model_config
        self._model_ready = None if (model_config is None or ensure_model_is_ready) else True
        self._ids = itertools.count()
        if not lazy_init:
            self._wait_and_init_model_config(self._init_timeout_s)

    def _create(self, timeout_s: float) -> Any:
        if self._triton_url.scheme == "grpc":
            return self._lib.InferenceServerClient(self._triton_url.without_scheme)
        return self._lib.InferenceServerClient(
            self._triton_url.without_scheme, network_timeout=timeout_s, connection_timeout=timeout_s
        )

    @classmethod
    def from_existing_client(cls, existing_client: ModelClient) -> ModelClient:
        return cls(
            existing_client._url,
            existing_client._model_name,
            existing_client._model_version,
            init_timeout_s=existing_client._init_timeout_s,
            inference_timeout_s=existing_client._inference_timeout_s,
            model_config=existing_client._model_config,
            ensure_model_is_ready=False,
        )

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        for client in (self._general_client, self._infer_client):
            if client is not None:
                client.close()
        self._general_client = self._infer_client = None

    def _general(self) -> Any:
        if self._general_client is None:
            raise PyTritonClientClosedError("ModelClient is closed")
        return self._general_client

    def wait_for_model(self, timeout_s: float) -> None:
        wait_for_model_ready(self._general(), self._model_name, self._model_version, timeout_s=timeout_s)

    def wait_for_server(self, timeout_s: float) -> None:
        wait_for_server_ready(self._general(), timeout_s=timeout_s)

    def load_model(self, config: str | None = None, files: dict | None = None) -> None:
        self._general().load_model(self._model_name, config=config, files=files)

    def unload_model(self) -> None:
        self._general().unload_model(self._model_name)

    @property
    def model_config(self) -> TritonModelConfig:
        if self._model_config is None:
            self._model_config = get_model_config(
                self._general(), self._model_name, self._model_version, timeout_s=self._init_timeout_s
            )
        return self._model_config

    @property
    def is_batching_supported(self) -> bool:
        return self.model_config.max_batch_size > 0

    def _wait_and_init_model_config(self, timeout_s: float) -> None:
        self.wait_for_model(timeout_s)
        self._model_ready = True
        _ = self.model_config

    def infer_sample(self, *inputs: np.ndarray, parameters=None, headers=None, **named_inputs: np.ndarray) -> Any:
        """One sample: the batch axis is added (batching models) and removed from the results."""
        verify_inputs_args(inputs, named_inputs)
        verify_parameters(parameters)
        verify_parameters(headers)
        if self.is_batching_supported:
            inputs = tuple(data[np.newaxis, ...] for data in inputs)
            named_inputs = {name: data[np.newaxis, ...] for name, data in named_inputs.items()}
        return self._debatch_result(self._infer(inputs or named_inputs, parameters, headers))

    def infer_batch(self, *inputs: np.ndarray, parameters=None, headers=None, **named_inputs: np.ndarray) -> Any:
        verify_inputs_args(inputs, named_inputs)
        verify_parameters(parameters)
        verify_parameters(headers)
        if not self.is_batching_supported:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {self.model_config.model_name} doesn't support batching - use infer_sample method instead"
            )
        return self._infer(inputs or named_inputs, parameters, headers)

    def _debatch_result(self, result: dict) -> Any:
        return {name: data[0] for name, data in result.items()} if self.is_batching_supported else result

    def _named(self, inputs: tuple | dict) -> dict[str, np.ndarray]:
        if self._infer_client is None:
            raise PyTritonClientClosedError("ModelClient is closed")
        if not self._model_ready:
            self._wait_and_init_model_config(self._init_timeout_s)
        if isinstance(inputs, tuple):
            inputs = {spec.name: data for spec, data in zip(self.model_config.inputs or [], inputs)}
        for name, data in inputs.items():
            check_input(name, data)
        return inputs

    def _request(self, inputs: tuple | dict) -> tuple[list, list]:
        wrapped = []
        for name, data in self._named(inputs).items():
            infer_input = self._lib.InferInput(
                name, list(data.shape), tritonclient.utils.np_to_triton_dtype(data.dtype)
            )
            infer_input.set_data_from_numpy(data)
            wrapped.append(infer_input)
        outputs = [self._lib.InferRequestedOutput(spec.name) for spec in self.model_config.outputs or []]
        return wrapped, outputs

    def _infer(self, inputs: tuple | dict, parameters: dict | None, headers: dict | None) -> Any:
        if self.model_config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is decoupled. Use DecoupledModelClient instead.")
        wrapped, outputs = self._request(inputs)
        extra = {"client_timeout": self._inference_timeout_s} if self._triton_url.scheme == "grpc" else {}
        try:
            response = self._infer_client.infer(
                model_name=self._model_name,
                model_version=self._model_version or "",
                inputs=wrapped,
                headers=headers,
                outputs=outputs,
                request_id=str(next(self._ids)),
                parameters=parameters,
                **extra,
            )
        except tritonclient.utils.InferenceServerException as exc:
            if "Deadline Exceeded" in (exc.message() or ""):
                raise PyTritonClientTimeoutError(
                    f"Timeout occurred during inference request. Timeout: {self._inference_timeout_s} s. Message: {exc.message()}"
                ) from exc
            raise PyTritonClientInferenceServerError(
                f"Error occurred during inference request. Message: {exc.message()}"
            ) from exc
        except (socket.timeout, OSError) as exc:  # tritonclient.http: timeouts and connection errors
            raise PyTritonClientTimeoutError(
                f"Timeout occurred during inference request. Timeout: {self._inference_timeout_s} s Message: {exc}"
            ) from exc
        return {spec.name: response.as_numpy(spec.name) for spec in self.model_config.outputs or []}


class DecoupledModelClient(ModelClient):
    """Client of a decoupled model: `infer_sample`/`infer_batch` return an iterator of responses.

    Over gRPC as PyTriton (a bidirectional stream); over HTTP (a Shoal extension) through
    `/generate_stream`, which takes inputs a generate request can express (scalars and 1-D
    arrays, shaped by the model's config)."""

    def __init__(self, url: str, model_name: str, model_version: str | None = None, **kwargs: Any) -> None:
        super().__init__(url, model_name, model_version, **kwargs)
        self._lock = threading.Lock()

    def _debatch_result(self, result: Any) -> Any:
        if self.is_batching_supported:
            return ({name: data[0] for name, data in item.items()} for item in result)
        return result

    def _infer(self, inputs: tuple | dict, parameters: dict | None, headers: dict | None) -> Iterator[dict]:
        if not self.model_config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is coupled. Use ModelClient instead.")
        if not self._lock.acquire(blocking=False):
            raise PyTritonClientInferenceServerError("Inference is already in progress")
        try:
            if self._triton_url.scheme == "grpc":
                wrapped, outputs = self._request(inputs)
                stream = response_streams.grpc_stream(
                    self, wrapped, outputs, str(next(self._ids)), self._inference_timeout_s
                )
            else:
                stream = response_streams.http_stream(self, self._named(inputs), parameters, self._inference_timeout_s)
        except BaseException:
            self._lock.release()
            raise
        return response_streams.released(stream, self._lock)


class FuturesModelClient:
    """Runs `infer_sample`/`infer_batch` on a pool of threads (a `ModelClient` each); returns futures."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        max_workers: int = 128,
        max_queue_size: int = 128,
        non_blocking: bool = False,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
    ) -> None:
        self._url, self._model_name, self._model_version = url, model_name, model_version
        self._kwargs: dict[str, Any] = {"init_timeout_s": init_timeout_s, "inference_timeout_s": inference_timeout_s}
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="shoal-futures-client")
        self._local = threading.local()
        self._clients: list[ModelClient] = []
        self._clients_lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> FuturesModelClient:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _client(self) -> ModelClient:
        client = getattr(self._local, "client", None)
        if client is None:  # tritonclient's HTTP client is not thread-safe: one per thread
            client = self._local.client = ModelClient(self._url, self._model_name, self._model_version, **self._kwargs)
            with self._clients_lock:
                self._clients.append(client)
        return client

    def _submit(self, method: str, *args: Any, **kwargs: Any) -> Future:
        if self._closed:
            raise PyTritonClientClosedError("FutureModelClient is already closed")
        return self._executor.submit(lambda: getattr(self._client(), method)(*args, **kwargs))

    def infer_sample(self, *inputs: np.ndarray, parameters=None, headers=None, **named_inputs: np.ndarray) -> Future:
        return self._submit("infer_sample", *inputs, parameters=parameters, headers=headers, **named_inputs)

    def infer_batch(self, *inputs: np.ndarray, parameters=None, headers=None, **named_inputs: np.ndarray) -> Future:
        return self._submit("infer_batch", *inputs, parameters=parameters, headers=headers, **named_inputs)

    def wait_for_model(self, timeout_s: float) -> Future:
        return self._submit("wait_for_model", timeout_s)

    def model_config(self) -> Future:
        return self._executor.submit(lambda: self._client().model_config)

    def close(self, wait: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=wait)
        with self._clients_lock:
            for client in self._clients:
                client.close()

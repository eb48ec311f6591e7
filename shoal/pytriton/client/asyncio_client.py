"""`AsyncioModelClient`: PyTriton's asyncio client on tritonclient's aio clients (HTTP and gRPC)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import numpy as np
import tritonclient.grpc.aio
import tritonclient.http.aio
import tritonclient.utils

from shoal.pytriton.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
)
from shoal.pytriton.client.utils import (
    _DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S,
    TritonUrl,
    check_input,
    parse_config,
    verify_inputs_args,
    verify_parameters,
)
from shoal.pytriton.model_config.triton_model_config import TritonModelConfig

DEFAULT_INFERENCE_TIMEOUT_S = 60.0


async def _ok(check: Any) -> bool:
    try:
        return bool(await check())
    except Exception:  # not listening yet, or an error answer: not ready
        return False


class AsyncioModelClient:
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
        self._model_name, self._model_version = model_name, model_version
        self._init_timeout_s = _DEFAULT_WAIT_FOR_MODEL_TIMEOUT_S if init_timeout_s is None else init_timeout_s
        self._inference_timeout_s = DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else inference_timeout_s
        self._grpc = self._triton_url.scheme == "grpc"
        self._lib: Any = tritonclient.grpc.aio if self._grpc else tritonclient.http.aio
        if self._grpc:
            self._client: Any = self._lib.InferenceServerClient(self._triton_url.without_scheme)
        else:
            self._client = self._lib.InferenceServerClient(
                self._triton_url.without_scheme, conn_timeout=self._inference_timeout_s
            )
        self._model_config = model_config
        self._model_ready = model_config is not None and not ensure_model_is_ready
        self._lazy_init = lazy_init
        self._ids = itertools.count()

    async def __aenter__(self) -> AsyncioModelClient:
        if not self._lazy_init:
            await self._wait_and_init(self._init_timeout_s)
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def wait_for_model(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        version = self._model_version or ""
        while not (
            await _ok(self._client.is_server_ready)
            and await _ok(lambda: self._client.is_model_ready(self._model_name, version))
        ):
            if time.monotonic() >= deadline:
                raise PyTritonClientTimeoutError(
                    f"Timeout while waiting for model {self._model_name} to be ready for {timeout_s}s"
                )
            await asyncio.sleep(0.1)

    @property
    async def model_config(self) -> TritonModelConfig:
        if self._model_config is None:
            await self.wait_for_model(self._init_timeout_s)
            kwargs = {"as_json": True} if self._grpc else {}
            answer = await self._client.get_model_config(self._model_name, self._model_version or "", **kwargs)
            self._model_config = parse_config(answer)
        return self._model_config

    async def _wait_and_init(self, timeout_s: float) -> None:
        await self.wait_for_model(timeout_s)
        self._model_ready = True
        await self.model_config

    async def infer_sample(self, *inputs: np.ndarray, parameters=None, headers=None, **named_inputs: np.ndarray):
        verify_inputs_args(inputs, named_inputs)
        verify_parameters(parameters)
        verify_parameters(headers)
        batching = (await self.model_config).max_batch_size > 0
        if batching:
            inputs = tuple(data[np.newaxis, ...] for data in inputs)
            named_inputs = {name: data[np.newaxis, ...] for name, data in named_inputs.items()}
        result = await self._infer(inputs or named_inputs, parameters, headers)
        return {name: data[0] for name, data in result.items()} if batching else result

    async def infer_batch(self, *inputs: np.ndarray, parameters=None, headers=None, **named_inputs: np.ndarray):
        verify_inputs_args(inputs, named_inputs)
        verify_parameters(parameters)
        verify_parameters(headers)
        config = await self.model_config
        if config.max_batch_size <= 0:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {config.model_name} doesn't support batching - use infer_sample method instead"
            )
        return await self._infer(inputs or named_inputs, parameters, headers)

    async def _infer(self, inputs: tuple | dict, parameters: dict | None, headers: dict | None) -> dict:
        if not self._model_ready:
            await self._wait_and_init(self._init_timeout_s)
        config = await self.model_config
        if config.decoupled:
            raise PyTritonClientInferenceServerError("Model config is decoupled. Use DecoupledModelClient instead.")
        if isinstance(inputs, tuple):
            inputs = {spec.name: data for spec, data in zip(config.inputs or [], inputs)}
        wrapped = []
        for name, data in inputs.items():
            check_input(name, data)
            infer_input = self._lib.InferInput(
                name, list(data.shape), tritonclient.utils.np_to_triton_dtype(data.dtype)
            )
            infer_input.set_data_from_numpy(data)
            wrapped.append(infer_input)
        outputs = [self._lib.InferRequestedOutput(spec.name) for spec in config.outputs or []]
        try:
            response = await asyncio.wait_for(
                self._client.infer(
                    model_name=self._model_name,
                    model_version=self._model_version or "",
                    inputs=wrapped,
                    outputs=outputs,
                    headers=headers,
                    request_id=str(next(self._ids)),
                    parameters=parameters,
                ),
                self._inference_timeout_s,
            )
        except asyncio.TimeoutError as exc:
            raise PyTritonClientTimeoutError(
                f"Timeout exceeded while running inference for {self._model_name}"
            ) from exc
        except tritonclient.utils.InferenceServerException as exc:
            raise PyTritonClientInferenceServerError(
                f"Error occurred on Triton Inference Server side:\n {exc.message()}"
            ) from exc
        return {spec.name: response.as_numpy(spec.name) for spec in config.outputs or []}

"""Transport-independent inference: a validated request in, output tensors out."""

from __future__ import annotations

import time

from services.gateway.codec import OutputTensor, ParsedRequest
from services.gateway.dispatch import Dispatcher
from services.gateway.validation import Validated
from shared.errors import ShoalError
from shared.messages import InferRequest, TensorRef
from shared.model_config import ModelSpec
from shared.tensors import TensorStore


class InferenceCore:
    def __init__(self, dispatcher: Dispatcher, store: TensorStore, timeout_s: float) -> None:
        self.dispatcher = dispatcher
        self.store = store
        self.timeout_s = timeout_s

    async def infer(
        self, spec: ModelSpec, version: int, parsed: ParsedRequest, valid: Validated
    ) -> tuple[list[OutputTensor], dict]:
        now = time.time_ns()
        rid = self.dispatcher.new_rid()
        inputs: list[TensorRef] = []
        try:
            for tensor in parsed.inputs:
                inputs.append(self.store.put(tensor.name, tensor.datatype, tensor.shape, tensor.data, self.timeout_s))
            request = InferRequest(
                rid=rid,
                model=spec.name,
                version=version,
                reply=self.dispatcher.reply_subject(rid),
                deadline_ns=now + int(self.timeout_s * 1e9),
                batch_size=valid.batch_size,
                shape_sig=valid.shape_sig,
                id=parsed.id,
                inputs=inputs,
                outputs=valid.outputs,
                parameters={k: v for k, v in parsed.parameters.items() if k != "binary_data_output"},
                received_ns=now,
            )
            response = await self.dispatcher.infer(request, self.timeout_s)
        finally:
            self.store.free(inputs)
        if response.error:
            await self.store.release_remote(response.outputs)
            raise ShoalError(response.error, response.code or "INTERNAL")
        try:
            outputs = [
                OutputTensor(
                    ref.name, ref.datatype, ref.shape,
                    await self.store.get(ref, self.timeout_s), valid.binary.get(ref.name, False),
                )
                for ref in response.outputs
            ]
        finally:
            await self.store.release_remote(response.outputs)
        return outputs, response.parameters

"""KServe v2 over gRPC: tritonclient's generated stubs on a grpc.aio channel.

The stubs are used directly (not `tritonclient.grpc.aio.InferenceServerClient.infer`) so that each
step's `ModelInferRequest` is built once and a request costs one RPC, nothing else.
"""

from __future__ import annotations

import time

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from shoal.perf.inputs import ModelInfo, ShmRef, Step, TensorSpec
from shoal.perf.measure import Record
from shoal.perf.options import PerfError


def _shm_params(params: object, ref: ShmRef) -> None:
    params["shared_memory_region"].string_param = ref.region  # type: ignore[index]
    params["shared_memory_byte_size"].int64_param = ref.byte_size  # type: ignore[index]
    if ref.offset:
        params["shared_memory_offset"].int64_param = ref.offset  # type: ignore[index]


def encode_step(step: Step, model: str, version: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for t in step.inputs:
        tensor = request.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        ref = step.input_shm.get(t.name)
        if ref is not None:
            _shm_params(tensor.parameters, ref)
        else:
            request.raw_input_contents.append(t.data)
    for name in step.outputs:
        output = request.outputs.add(name=name)
        if name in step.output_shm:
            _shm_params(output.parameters, step.output_shm[name])
    return request


def _failure(exc: grpc.aio.AioRpcError) -> PerfError:
    return PerfError(f"{exc.code().name}: {exc.details()}")


class GrpcTransport:
    def __init__(self, url: str, model: str, version: str, timeout_s: float) -> None:
        self.channel = grpc.aio.insecure_channel(
            url.removeprefix("grpc://"),
            options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.model, self.version, self.timeout_s = model, version, timeout_s
        self.requests: list[pb.ModelInferRequest] = []

    async def _call(self, method: str, request: object) -> object:
        try:
            return await getattr(self.stub, method)(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None

    async def model_info(self) -> ModelInfo:
        meta = await self._call("ModelMetadata", pb.ModelMetadataRequest(name=self.model, version=self.version))
        config = await self._call("ModelConfig", pb.ModelConfigRequest(name=self.model, version=self.version))

        def specs(entries: object) -> list[TensorSpec]:
            return [TensorSpec(e.name, e.datatype, list(e.shape)) for e in entries]  # type: ignore[attr-defined]

        return ModelInfo(
            self.model,
            self.version,
            config.config.max_batch_size,  # type: ignore[attr-defined]
            specs(meta.inputs),  # type: ignore[attr-defined]
            specs(meta.outputs),  # type: ignore[attr-defined]
        )

    def prepare(self, steps: list[Step]) -> None:
        self.requests = [encode_step(step, self.model, self.version) for step in steps]

    async def infer(self, step: int) -> Record:
        start = time.perf_counter_ns()
        try:
            await self.stub.ModelInfer(self.requests[step], timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None
        return Record(start, time.perf_counter_ns())

    async def statistics(self) -> dict:
        answer = await self._call("ModelStatistics", pb.ModelStatisticsRequest(name=self.model, version=self.version))
        # uint64 fields come out of MessageToDict as strings; measure.server_delta reads them with int()
        return json_format.MessageToDict(answer, preserving_proto_field_name=True)  # type: ignore[arg-type]

    async def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=byte_size)
        await self._call("SystemSharedMemoryRegister", request)

    async def unregister_system_shm(self, name: str) -> None:
        await self._call("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name))

    async def close(self) -> None:
        await self.channel.close()

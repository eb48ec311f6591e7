"""`--streaming`: every request on a gRPC bidirectional stream (`ModelStreamInfer`), as perf_analyzer's.

perf_analyzer gives each concurrent context a stream of its own and sends its next request when the
last one's final response came; so does this transport: a request takes an idle stream from the pool
(or opens one), writes, reads up to the response flagged `triton_final_response`, and gives the
stream back, so a closed loop at concurrency N holds N streams. Decoupled models' many responses are
read through their empty final response (`triton_enable_empty_final_response`).
"""

from __future__ import annotations

import time

import grpc
from tritonclient.grpc import service_pb2 as pb

from shoal.perf.inputs import Step
from shoal.perf.measure import Record
from shoal.perf.options import PerfError
from shoal.perf.over_grpc import GrpcTransport, _failure


def _final(response: pb.ModelInferResponse) -> bool:
    flag = response.parameters.get("triton_final_response")
    # a server that does not flag responses (no decoupled support) answers each request once
    return flag is None or flag.bool_param


class StreamingGrpcTransport(GrpcTransport):
    def __init__(self, url: str, model: str, version: str, timeout_s: float) -> None:
        super().__init__(url, model, version, timeout_s)
        self.idle: list[grpc.aio.StreamStreamCall] = []
        self.streams: list[grpc.aio.StreamStreamCall] = []

    def prepare(self, steps: list[Step]) -> None:
        super().prepare(steps)
        for request in self.requests:
            request.parameters["triton_enable_empty_final_response"].bool_param = True

    def _stream(self) -> grpc.aio.StreamStreamCall:
        if self.idle:
            return self.idle.pop()
        call = self.stub.ModelStreamInfer()
        self.streams.append(call)
        return call

    async def infer(self, step: int) -> Record:
        call = self._stream()
        start = time.perf_counter_ns()
        try:
            await call.write(self.requests[step])
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    raise PerfError("the server closed the stream")
                if message.error_message:
                    raise PerfError(message.error_message)
                if _final(message.infer_response):
                    break
        except grpc.aio.AioRpcError as exc:
            raise _failure(exc) from None
        end = time.perf_counter_ns()
        self.idle.append(call)  # only a stream in a known state goes back to the pool
        return Record(start, end)

    async def close(self) -> None:
        for call in self.streams:
            call.cancel()
        await super().close()

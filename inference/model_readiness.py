"""Model readiness that asks the model (Triton's `TRITONBACKEND_ModelInstanceReady`): a python
model's own `is_ready()` is consulted on every readiness request (HTTP `GET
/v2/models/{m}[/versions/{v}]/ready`, gRPC `ModelReady`), in each worker process that hosts
instances of it (services/worker/readiness.py runs the checks there).

Which processes host which model comes from the workers' reports of their instances (KV
`shoal-instances`, one record per process and model version, written before the repository marks
the version READY), so a check asks exactly those, concurrently; one that went away without
deleting its record (no responders) counts as hosting nothing.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.js.kv import KeyValue

from shared.bus import buckets
from shared.wire import subjects
from shared.wire.messages import ReadinessAnswer, ReadinessCheck, encode
from shared.wire.records import InstanceRecord

log = logging.getLogger("shoal.gateway")

# a worker's own checks take at most 5 s (a new one), or 5 s more waiting on one in flight
ASK_TIMEOUT_S = 12.0
TIMED_OUT = "Timed out waiting for user-defined is_ready() response"
# backends without a readiness function of the model's own: the registry's state is the answer
NO_USER_CHECK = frozenset(
    {"", "onnxruntime", "pytorch", "tensorrt", "identity", "repeat", "square", "fil", "openvino", "dali"}
)

_record_decoder = msgspec.msgpack.Decoder(InstanceRecord)
_answer_decoder = msgspec.msgpack.Decoder(ReadinessAnswer)


class HostedInstances:
    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.records: dict[str, tuple[str, str, int]] = {}  # KV key -> (worker, model, version)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        kv = await buckets.bucket(self.nc, subjects.INSTANCES_BUCKET)
        self._task = asyncio.create_task(self._watch(kv))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self, kv: KeyValue) -> None:
        async for change in buckets.watch(self.nc, kv):
            if not change.key:
                continue
            if change.value is None:
                self.records.pop(change.key, None)
                continue
            try:
                record = _record_decoder.decode(change.value)
            except msgspec.DecodeError:
                continue
            self.records[change.key] = (record.worker, record.model, record.version)

    def hosts(self, model: str, version: int) -> list[str]:
        return sorted({w for w, m, v in self.records.values() if m == model and v == version})

    async def check(self, model: str, version: int) -> tuple[bool, str]:
        """Every hosting process's instances ready, else the first reason."""
        answers = await asyncio.gather(*(self._ask(worker, model, version) for worker in self.hosts(model, version)))
        for ready, message in answers:
            if not ready:
                return False, message
        return True, ""

    async def _ask(self, worker: str, model: str, version: int) -> tuple[bool, str]:
        try:
            reply = await self.nc.request(
                subjects.worker_readiness(worker), encode(ReadinessCheck(model, version)), timeout=ASK_TIMEOUT_S
            )
        except NoRespondersError:  # gone, its record left behind
            return True, ""
        except TimeoutError:
            return False, TIMED_OUT
        answer = _answer_decoder.decode(reply.data)
        return answer.ready, answer.message

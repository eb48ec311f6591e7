"""`--shared-memory system`: inputs written once into POSIX shared memory, outputs written there by the server.

Regions are created with tritonclient.utils.shared_memory and registered through the transport; like
perf_analyzer, one output region per output is shared by all requests (its contents are not read).
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import triton_to_np_dtype

from shoal.perf.inputs import ModelInfo, ShmRef, Step
from shoal.perf.transport import Transport


def output_byte_size(info: ModelInfo, name: str, batch_size: int, default: int) -> int:
    spec = next(o for o in info.outputs if o.name == name)
    dims = spec.shape[1:] if info.max_batch_size > 0 else spec.shape
    dtype = triton_to_np_dtype(spec.datatype) if spec.datatype != "BYTES" else None
    if dtype is None or any(d < 0 for d in dims):
        return default
    return int(np.prod(dims)) * np.dtype(dtype).itemsize * (batch_size if info.max_batch_size > 0 else 1)


class SystemShm:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.regions: list[tuple[str, object]] = []
        self.prefix = f"perf_{os.getpid()}"  # "shoal_" keys are reserved for the server's own segments

    async def _region(self, name: str, data: bytes) -> ShmRef:
        region = f"{self.prefix}_{name}"
        handle = shm.create_shared_memory_region(region, f"/{region}", max(len(data), 1))
        self.regions.append((region, handle))
        if data:
            shm.set_shared_memory_region(handle, [np.frombuffer(data, dtype=np.uint8)])
        await self.transport.register_system_shm(region, f"/{region}", max(len(data), 1))
        return ShmRef(region, 0, len(data))

    async def place(self, steps: list[Step], info: ModelInfo, batch_size: int, output_size: int) -> list[Step]:
        outputs = {
            name: await self._region(f"out_{name}", bytes(output_byte_size(info, name, batch_size, output_size)))
            for name in steps[0].outputs
        }
        placed = []
        for i, step in enumerate(steps):
            inputs = {t.name: await self._region(f"{i}_{t.name}", t.data) for t in step.inputs}
            placed.append(replace(step, input_shm=inputs, output_shm=outputs))
        return placed

    async def close(self) -> None:
        for region, handle in reversed(self.regions):
            try:
                await self.transport.unregister_system_shm(region)
            finally:
                shm.destroy_shared_memory_region(handle)
        self.regions.clear()

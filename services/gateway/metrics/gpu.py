"""GPU gauges with Triton's names, read through NVML (`nvidia-ml-py`, in the `gpu` extra).

Import-guarded: without NVML or a GPU there are simply no GPU metrics, as in Triton on a
CPU-only host. Triton reads DCGM; NVML gives the same quantities per device.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("shoal.gateway")


class GpuMetrics:
    def __init__(self) -> None:
        self._nvml = None
        self._energy_start: dict[str, float] = {}
        self._lock = threading.Lock()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # no NVML library, no driver, no device: no GPU metrics
            log.debug("no GPU metrics: %s", exc)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def read(self) -> list[tuple[str, str, str, dict[str, str], float]]:
        """(name, help, type, labels, value) samples for every visible GPU."""
        if self._nvml is None:
            return []
        nvml = self._nvml
        samples = []
        with self._lock:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                labels = {"gpu_uuid": uuid}
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
                power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                limit = nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
                energy = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0
                start = self._energy_start.setdefault(uuid, energy)
                samples += [
                    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", labels, utilization),
                    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", labels, memory.total),
                    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", labels, memory.used),
                    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", labels, power),
                    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", labels, limit),
                    (
                        "nv_energy_consumption",
                        "GPU energy consumption in joules since the Triton Server started",
                        "counter",
                        labels,
                        energy - start,
                    ),
                ]
        return samples

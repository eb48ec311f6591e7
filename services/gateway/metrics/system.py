"""Host CPU and memory, as Triton's `nv_cpu_*` metrics report them (from /proc)."""

from __future__ import annotations

import glob
import os
import time


class CpuSampler:
    """CPU utilisation between consecutive reads (0..1), like Triton's per-interval gauge."""

    def __init__(self) -> None:
        self._last = self._times()
        self._last_at = time.monotonic()

    @staticmethod
    def _times() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    def utilization(self) -> float:
        total, idle = self._times()
        last_total, last_idle = self._last
        self._last = (total, idle)
        spent = total - last_total
        return 0.0 if spent <= 0 else max(0.0, min(1.0, 1 - (idle - last_idle) / spent))


def memory() -> tuple[int, int]:
    """(total, used) bytes of RAM, used = total - available."""
    values: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    total = values.get("MemTotal", 0)
    return total, total - values.get("MemAvailable", values.get("MemFree", 0))


def shm_bytes_in_use() -> int:
    """Bytes in Shoal's tensor segments on this host (every process's, not only this one's)."""
    total = 0
    for path in glob.glob("/dev/shm/shoal_*"):
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total

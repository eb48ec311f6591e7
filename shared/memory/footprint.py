"""What a model costs in memory, measured at load: this process's resident set and its GPU memory.

Read before and after a model's instances are created; the difference is the model's size. The
budget flags take bytes (with an optional K/M/G/T suffix, powers of 1024) or a percentage of the
host's RAM (docs/models.md, "Models on demand").
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def total_ram() -> int:
    """The host's physical memory in bytes (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def parse_budget(text: str, ram: int | None = None) -> int:
    """`--model-memory-budget`: bytes (`2G`, `512M`, `1073741824`) or `N%` of RAM; 0 means no budget."""
    value = text.strip().upper().removesuffix("B")
    if not value:
        return 0
    try:
        if value.endswith("%"):
            percent = float(value[:-1])
            if not 0 <= percent <= 100:
                raise ValueError
            return int((total_ram() if ram is None else ram) * percent / 100)
        unit = value[-1] if value[-1] in _UNITS else ""
        number = float(value[: len(value) - len(unit)])
        if number < 0:
            raise ValueError
        return int(number * _UNITS[unit])
    except ValueError:
        raise ValueError(
            f"invalid memory budget '{text}': use bytes (e.g. 2G, 512M) or a percentage of RAM (40%)"
        ) from None


def rss_bytes() -> int:
    """This process's resident set now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def proportional_bytes() -> int:
    """This process's proportional set size (PSS): its private pages plus its share of the pages it
    shares with other processes (the libraries every python model process maps), so that the
    figures of many processes add up to what they take together. Linux /proc; the resident set
    where PSS is not reported."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss_bytes()


def device_bytes() -> int:
    """GPU memory this process holds on every device NVML sees (0 without NVML or a GPU)."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver
        return 0
    try:
        pid, used = os.getpid(), 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == pid and process.usedGpuMemory:
                    used += int(process.usedGpuMemory)
        return used
    except Exception as exc:
        log.debug("NVML could not say this process's GPU memory: %s", exc)
        return 0
    finally:
        pynvml.nvmlShutdown()

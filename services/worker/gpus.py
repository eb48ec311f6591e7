"""Which CUDA devices this worker can use, found without importing a deep-learning framework.

NVML (`nvidia-ml-py`, in the `gpu` extra) counts the devices cheaply; CuPy is the second
choice. `CUDA_VISIBLE_DEVICES` narrows the set as CUDA itself would (ids are renumbered
from 0, as every CUDA library then sees them). No library or no driver means no GPUs.
"""

from __future__ import annotations

import functools
import logging
import os

log = logging.getLogger("shoal.worker")


def _device_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no NVML library or no driver
        log.debug("NVML sees no GPU: %s", exc)
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        log.debug("CuPy sees no GPU: %s", exc)
    return 0


def visible_ids(count: int, cuda_visible_devices: str | None) -> list[int]:
    """The ids CUDA programs in this process see: 0..n-1 over the devices the variable keeps."""
    if cuda_visible_devices is None:
        return list(range(count))
    kept = [d for d in cuda_visible_devices.split(",") if d.strip()]
    if any(d.strip().startswith("-") for d in kept):  # CUDA stops at the first invalid id
        kept = kept[: next(i for i, d in enumerate(kept) if d.strip().startswith("-"))]
    return list(range(min(len(kept), count)))


@functools.cache
def available_gpus() -> tuple[int, ...]:
    return tuple(visible_ids(_device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")))

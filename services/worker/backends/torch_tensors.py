"""Tensors between numpy and torch, and the device an instance runs on (both PyTorch formats).

BYTES inputs reach a model as `List[str]` (flattened, UTF-8) and a `List[str]` result comes back
as BYTES; BF16 travels through an int16 view, since numpy's bfloat16 is ml_dtypes' and torch
cannot take it directly.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch

from shared.errors import Code, ShoalError, unavailable

_BF16 = np.dtype(ml_dtypes.bfloat16)


def flag(value: str, default: bool) -> bool:
    return default if not value else value.strip().lower() in ("1", "true", "yes", "on")


def to_torch(array: np.ndarray, device: torch.device) -> Any:
    if array.dtype == object:  # BYTES: TorchScript takes List[str]
        return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]
    if array.dtype == _BF16:
        tensor = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    else:
        # inputs read from a request buffer are read-only: a model may write into its inputs
        tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    return tensor.to(device) if device.type != "cpu" else tensor


def to_numpy(value: Any, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        if value.dtype == torch.bfloat16:
            return value.contiguous().view(torch.int16).numpy().view(_BF16)
        return value.contiguous().numpy()
    if isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
        return np.array([x.encode("utf-8") for x in value], dtype=object)
    raise ShoalError(
        f"output '{name}' of the model is a {type(value).__name__}, not a tensor or a list of strings", Code.INTERNAL
    )


def torch_device(kind: str, device: int) -> torch.device:
    """KIND_GPU: `cuda:<device>`, refused where torch sees no such GPU; else the CPU."""
    if kind != "KIND_GPU":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise unavailable(
            "instance kind KIND_GPU needs a CUDA build of torch and an NVIDIA GPU "
            f"(this torch {torch.__version__} sees none)"
        )
    if device >= torch.cuda.device_count():
        raise unavailable(f"GPU {device} is not visible to torch ({torch.cuda.device_count()} device(s))")
    return torch.device(f"cuda:{device}")

"""A model input or output, as PyTriton declares it (a missing name gets INPUT_<n>/OUTPUT_<n>)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Tensor:
    shape: tuple
    dtype: Any  # np.float32, np.dtype("float32"), np.bytes_, bytes, object
    name: str | None = None
    optional: bool | None = False

    def __post_init__(self) -> None:
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)

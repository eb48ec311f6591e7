"""The request an inference function receives: a dict-like of input arrays with its parameters."""

from __future__ import annotations

import dataclasses
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from typing import Any

import numpy as np


@dataclasses.dataclass
class Request:
    data: dict[str, np.ndarray]
    parameters: dict[str, Any] | None = None

    def __getitem__(self, input_name: str) -> np.ndarray:
        return self.data[input_name]

    def __setitem__(self, input_name: str, input_data: np.ndarray) -> None:
        self.data[input_name] = input_data

    def __delitem__(self, input_name: str) -> None:
        del self.data[input_name]

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __contains__(self, input_name: object) -> bool:
        return input_name in self.data

    def items(self) -> ItemsView[str, np.ndarray]:
        return self.data.items()

    def keys(self) -> KeysView[str]:
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        return self.data.values()


Requests = list[Request]

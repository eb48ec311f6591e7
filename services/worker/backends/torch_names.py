"""How config tensor names bind to a TorchScript `forward()` (Triton's libtorch conventions).

TorchScript keeps no tensor names, so Triton's PyTorch backend binds them by convention:

- inputs: FORWARD_ARGUMENT when every config input is a `forward()` argument name (bound by
  keyword, so an omitted optional input takes the argument's default); else NAMED_INDEX
  when every name is `<anything>__<index>` (position = index); else
  STRICT_CONFIG_ORDERING (position = order in the config);
- outputs: a dict result is read by name; otherwise NAMED_INDEX when every name is
  `<anything>__<index>` (the index into the returned tuple/list, a lone tensor is index 0),
  else the config order.

Pure logic: no torch import, so it is tested without torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.errors import invalid

_INDEXED = re.compile(r"^.+__(\d+)$")
FORWARD_ARGUMENT, NAMED_INDEX, STRICT_CONFIG_ORDERING = "FORWARD_ARGUMENT", "NAMED_INDEX", "STRICT_CONFIG_ORDERING"


def _indices(names: list[str]) -> dict[str, int] | None:
    indices = {}
    for name in names:
        match = _INDEXED.match(name)
        if match is None:
            return None
        indices[name] = int(match.group(1))
    return indices or None


@dataclass(frozen=True)
class InputBinding:
    convention: str
    positions: dict[str, int]  # config name -> position in forward() (FORWARD_ARGUMENT: by keyword)

    def arguments(self, tensors: dict[str, object]) -> tuple[list[object], dict[str, object]]:
        """Positional and keyword arguments for `forward()` from the request's named tensors."""
        if self.convention == FORWARD_ARGUMENT:
            return [], dict(tensors)
        given = sorted((self.positions[name], tensor) for name, tensor in tensors.items())
        if [p for p, _ in given] != list(range(len(given))):
            missing = sorted(set(range(len(given) + 1)) - {p for p, _ in given})[0]
            raise invalid(
                f"input at position {missing} of forward() is missing: an omitted optional input must be the "
                "last one (or name the inputs after forward()'s arguments to pass them by keyword)"
            )
        return [t for _, t in given], {}


def bind_inputs(model: str, names: list[str], forward_args: list[str]) -> InputBinding:
    if names and all(n in forward_args for n in names):
        return InputBinding(FORWARD_ARGUMENT, {n: forward_args.index(n) for n in names})
    indices = _indices(names)
    if indices is not None:
        if len(set(indices.values())) != len(indices):
            raise invalid(f"model '{model}': two inputs share an index in the <name>__<index> naming convention")
        if max(indices.values()) >= len(forward_args) > 0:
            raise invalid(
                f"model '{model}': input index {max(indices.values())} is out of range; forward() takes "
                f"{len(forward_args)} argument(s): {', '.join(forward_args)}"
            )
        return InputBinding(NAMED_INDEX, indices)
    if forward_args and len(names) > len(forward_args):
        raise invalid(
            f"model '{model}': the config has {len(names)} inputs but forward() takes {len(forward_args)} "
            f"argument(s): {', '.join(forward_args)}"
        )
    return InputBinding(STRICT_CONFIG_ORDERING, {n: i for i, n in enumerate(names)})


def bind_outputs(names: list[str]) -> dict[str, int]:
    """Config output name -> index into the returned tuple/list."""
    indices = _indices(names)
    return indices if indices is not None else {n: i for i, n in enumerate(names)}

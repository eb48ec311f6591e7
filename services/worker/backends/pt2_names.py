"""How config tensor names bind to a PyTorch 2 program's flat inputs and outputs (`torch_aoti`).

A `model.pt2` carries its call specification: the tree of its inputs (a tuple of the positional
arguments and a dict of the keyword arguments) and of its result, each leaf a tensor. As in
Triton's PyTorch backend (PT2 support), a leaf is addressed either by its place among the
flattened leaves, `INPUT__<i>` / `OUTPUT__<i>`, or by its path in the tree: `ARGS[0]`,
`ARGS[2][key]`, `KWARGS[name]`, `RESULT[key][1]`, and `RESULT` alone for a lone tensor.

Pure logic: a tree is `None` (a tensor leaf), `list[Tree]` (a tuple or list) or `dict[str, Tree]`
(its keys in the model's order), so it is tested without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from shared.errors import invalid

Tree = Union[None, list["Tree"], dict[str, "Tree"]]


def paths(tree: Tree) -> list[str]:
    """The leaves' path suffixes in flattening order (`[]` for a lone leaf)."""
    if tree is None:
        return []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    names = []
    for key, child in items:
        entry = f"[{key}]"
        names.extend([entry + rest for rest in paths(child)] if child is not None else [entry])
    return names


@dataclass(frozen=True)
class Interface:
    """The program's leaf names by flat position, and the ordinal prefix addressing them."""

    names: list[str]
    ordinal: str  # INPUT or OUTPUT

    def position(self, name: str) -> int | None:
        if name in self.names:
            return self.names.index(name)
        prefix = f"{self.ordinal}__"
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            index = int(name[len(prefix) :])
            return index if index < len(self.names) else None
        return None

    def describe(self) -> str:
        return ", ".join(f"{n} ({self.ordinal}__{i})" for i, n in enumerate(self.names)) or "none"


def input_interface(args: Tree, kwargs: Tree) -> Interface:
    names = [f"ARGS{p}" for p in paths(args)] + [f"KWARGS{p}" for p in paths(kwargs)]
    return Interface(names, "INPUT")


def output_interface(result: Tree) -> Interface:
    return Interface([f"RESULT{p}" for p in paths(result)] if result is not None else ["RESULT"], "OUTPUT")


def bind(model: str, kind: str, names: list[str], interface: Interface) -> dict[str, int]:
    """Config name -> flat position; a name the program does not have fails the load."""
    positions = {}
    for name in names:
        position = interface.position(name)
        if position is None:
            raise invalid(
                f"model '{model}': {kind} \"{name}\" is not in the model's call specification "
                f'(io_data does not contain name: "{name}"); the model\'s {kind}s are {interface.describe()}'
            )
        positions[name] = position
    if len(set(positions.values())) != len(positions):
        raise invalid(f"model '{model}': two {kind}s of the config address the same {kind} of the model")
    return positions


def bind_all_inputs(model: str, names: list[str], interface: Interface) -> dict[str, int]:
    """As `bind`, and every input of the program must be given (it has no optional inputs)."""
    positions = bind(model, "input", names, interface)
    if len(positions) != len(interface.names):
        missing = [n for i, n in enumerate(interface.names) if i not in positions.values()]
        raise invalid(
            f"model '{model}': the config has {len(positions)} inputs but the model takes "
            f"{len(interface.names)}; missing: {', '.join(missing)}"
        )
    return positions

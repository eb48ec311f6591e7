"""On-demand placement and eviction, as pure decisions: which worker takes a model, and which
loaded models leave to make room for it (docs/models.md, "Models on demand").

A worker has a budget (bytes, a model count, or both). A model may load where it fits; when
none has room, the least recently used models that are neither in use nor pinned are evicted,
oldest first, until it fits. A worker holding nothing takes any model, whatever its size: the
budget is exceeded by at most one model (whose size is unknown before its first load).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MEMORY = "memory budget"
COUNT = "model count"


@dataclass(frozen=True)
class Resident:
    """A model loaded on a worker."""

    name: str
    size: int  # bytes measured at load (or the estimate while it loads)
    last_used: float  # wall-clock seconds
    busy: bool = False  # requests wait or run on it, or a sequence holds it
    pinned: bool = False  # never evicted: explicit load, --pin-model, or its config


@dataclass(frozen=True)
class Room:
    """One worker: its budget and what it holds."""

    worker: str
    budget_bytes: int  # 0: no memory budget
    max_models: int  # 0: no count budget
    residents: tuple[Resident, ...] = ()

    def fits(self, size: int, leaving: Sequence[Resident] = ()) -> bool:
        staying = [r for r in self.residents if r not in leaving]
        if not staying:
            return True
        if self.max_models and len(staying) + 1 > self.max_models:
            return False
        return not self.budget_bytes or sum(r.size for r in staying) + size <= self.budget_bytes

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - sum(r.size for r in self.residents) if self.budget_bytes else 1 << 62


@dataclass(frozen=True)
class Placement:
    worker: str
    evict: tuple[Resident, ...]
    reason: str  # why they are evicted (MEMORY or COUNT); "" when nothing is


def victims(room: Room, size: int) -> tuple[Resident, ...] | None:
    """The least recently used idle, unpinned residents whose leaving lets `size` in (none if it
    fits already); None when evicting every one of them is not enough."""
    candidates = sorted((r for r in room.residents if not r.busy and not r.pinned), key=lambda r: r.last_used)
    chosen: list[Resident] = []
    for candidate in [None, *candidates]:
        if candidate is not None:
            chosen.append(candidate)
        if room.fits(size, chosen):
            return tuple(chosen)
    return None


def place(rooms: Sequence[Room], size: int) -> Placement | None:
    """The worker with room (the most free, then the fewest models); else the one where the
    fewest evictions make room. None: every worker is full of models in use or pinned."""
    fitting = [r for r in rooms if r.fits(size)]
    if fitting:
        best = max(fitting, key=lambda r: (r.free_bytes, -len(r.residents)))
        return Placement(best.worker, (), "")
    options = [(room, chosen) for room in rooms if (chosen := victims(room, size)) is not None]
    if not options:
        return None
    room, chosen = min(options, key=lambda option: (len(option[1]), min(r.last_used for r in option[1])))
    counted = room.max_models and len(room.residents) + 1 > room.max_models
    return Placement(room.worker, chosen, COUNT if counted else MEMORY)

"""Iterations of a decoupled ensemble: which tensors each one sees, what runs, when it is done.

Pure bookkeeping, no I/O (the runner in `ensemble_stream.py` drives it). Triton's model
(docs/triton-spec.md §3.5): every response of a decoupled step is an *iteration*; its outputs, together
with the tensors produced upstream of that step, trigger the downstream steps for that
iteration, and the iteration answers the client once all requested outputs exist in it.

An iteration is a `Scope`: its own tensors over its parent's (the scope the decoupled step
ran in; the root holds the ensemble inputs). A step runs in a scope once, when all of its
inputs are visible there and at least one is the scope's own (otherwise it runs, once, in
the ancestor that has them all). A tensor that arrives late in an ancestor (a slow
preprocess next to a fast generator) is seen by every live iteration below it.

A scope is *settled* when nothing in it runs or waits and no ancestor can still receive a
tensor: then its own tensors can be freed at once, so a long stream holds the
intermediates of only the iterations in flight.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from shared.config.ensemble_graph import Step

T = TypeVar("T")  # a tensor handle (TensorRef in the runner)


@dataclass(eq=False)
class Scope(Generic[T]):
    path: tuple[int, ...]  # () for the root; a child appends its response index
    parent: Scope[T] | None = None
    tensors: dict[str, T] = field(default_factory=dict)  # produced in this iteration
    batched: dict[str, bool] = field(default_factory=dict)  # whether each has a batch dimension
    launched: set[int] = field(default_factory=set)  # steps run (or queued) in this scope
    running: int = 0  # step requests in flight or waiting for an in-flight slot
    producing: int = 0  # of those, the ones whose outputs land in this scope (non-decoupled)
    children: list[Scope[T]] = field(default_factory=list)  # live iterations below
    responses: int = 0  # decoupled steps' responses seen here: the next child's index
    answered: bool = False
    settled: bool = False

    def lookup(self, name: str) -> T | None:
        scope: Scope[T] | None = self
        while scope is not None:
            if name in scope.tensors:
                return scope.tensors[name]
            scope = scope.parent
        return None

    def is_batched(self, name: str) -> bool:
        scope: Scope[T] | None = self
        while scope is not None:
            if name in scope.batched:
                return scope.batched[name]
            scope = scope.parent
        return True

    def visible(self) -> dict[str, T]:
        """Every tensor this scope sees, its own over its ancestors'."""
        chain = []
        scope: Scope[T] | None = self
        while scope is not None:
            chain.append(scope.tensors)
            scope = scope.parent
        merged: dict[str, T] = {}
        for tensors in reversed(chain):
            merged.update(tensors)
        return merged

    def ready_steps(self, steps: Iterable[Step]) -> list[Step]:
        """Steps to run here now: inputs all visible, at least one of them this scope's own
        (the root owns everything it sees), not run here yet."""
        ready = []
        for step in steps:
            if step.index in self.launched:
                continue
            names = step.input_map.values()
            if all(self.lookup(t) is not None for t in names) and (
                self.parent is None or any(t in self.tensors for t in names)
            ):
                ready.append(step)
        return ready

    def due(self, requested: list[str]) -> bool:
        """Whether this iteration answers the client now: every requested output exists and at
        least one is its own (an iteration does not repeat an answer its ancestor gave)."""
        if self.answered or not requested:
            return False
        if not all(self.lookup(t) is not None for t in requested):
            return False
        return self.parent is None or any(t in self.tensors for t in requested)

    def ancestors_producing(self) -> bool:
        scope = self.parent
        while scope is not None:
            if scope.producing:
                return True
            scope = scope.parent
        return False

    def can_settle(self) -> bool:
        return not self.settled and not self.running and not self.children and not self.ancestors_producing()

    def walk(self) -> Iterator[Scope[T]]:
        """This scope and its live descendants, parents first."""
        yield self
        for child in list(self.children):
            yield from child.walk()

    def child(self) -> Scope[T]:
        scope: Scope[T] = Scope(path=self.path + (self.responses,), parent=self)
        self.responses += 1
        self.children.append(scope)
        return scope


def settle(root: Scope[T]) -> list[Scope[T]]:
    """Mark every scope that is done as settled (children before parents, so a parent whose
    last child settles settles in the same pass) and detach it; the settled scopes, whose own
    tensors the caller frees."""
    done: list[Scope[T]] = []

    def visit(scope: Scope[T]) -> None:
        for child in list(scope.children):
            visit(child)
        if scope.can_settle():
            scope.settled = True
            if scope.parent is not None:
                scope.parent.children.remove(scope)
            done.append(scope)

    visit(root)
    return done

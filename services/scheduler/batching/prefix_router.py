"""Prefix-aware routing: which instance a request whose prompt starts like an earlier one's goes to
(docs/design.md, "Prefix-aware routing").

A request may carry its prompt's prefix blocks (`RequestHeader.route`: a chain of hashes, each of
one fixed-size block of the prompt and of every block before it, derived by the OpenAI front end).
The router remembers, for a bounded number of recent blocks, the instances it sent them to; a
request goes where its cost is lowest: the blocks it would have to prefill there (the longer the
run of its blocks an instance was sent, the likelier its KV cache still holds them) against the
instance's load, as NVIDIA Dynamo's KV router weighs them. Affinity must not pile conversations
onto one instance: a shared system prompt alone does not outweigh a request of load, and an
instance whose load is over a cap above the least loaded one's gets no credit for its match at
all. Ties, and requests that match nowhere, go to the least loaded.

Load is what this replica sees: the batches it has in flight on the instance plus the requests it
routed there among its latest `window` decisions (a decoupled model's execute returns as soon as
the stream has joined, so batches in flight alone would miss the streams still running). Pure:
no I/O, no clock; the pump (`pump.take_slot`) asks it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

CAPACITY = 8192  # blocks remembered (least recently routed forgotten first)
HOLDERS = 4  # instances remembered per block (the latest ones it went to)
WINDOW = 32  # latest routing decisions that count as load
SLACK = 2  # an instance may be this much over the least loaded, or ...
RATIO = 1.5  # ... this many times its load, and still be preferred for its prefix
LOAD_BLOCKS = 2  # a request more of load weighs as much as this many blocks of prefix matched


class PrefixRouter(Generic[T]):
    def __init__(self, capacity: int = CAPACITY, window: int = WINDOW) -> None:
        if capacity < 1 or window < 1:
            raise ValueError("a prefix router remembers at least one block and one decision")
        self.capacity = capacity
        self._holders: OrderedDict[int, tuple[T, ...]] = OrderedDict()  # block -> instances, latest first
        self._recent: deque[T] = deque(maxlen=window)
        self._routed: Counter[T] = Counter()  # of `_recent`, per instance

    def __len__(self) -> int:
        """Blocks remembered."""
        return len(self._holders)

    def matched(self, blocks: Sequence[int], target: T) -> int:
        """How many of `blocks`, from the first, were last routed to (one of) `target`'s."""
        depth = 0
        for index, block in enumerate(blocks):
            holders = self._holders.get(block)
            if holders is not None and target in holders:
                depth = index + 1  # chained hashes: a block names its whole prefix
        return depth

    def load(self, target: T, in_flight: int = 0) -> int:
        return in_flight + self._routed[target]

    def choose(self, blocks: Sequence[int], in_flight: Mapping[T, int]) -> T:
        """The candidate (keys of `in_flight`: those that may run the request now, with their
        batches in flight) to send a request with these prefix blocks to: the lowest cost, where a
        request of load costs `LOAD_BLOCKS` and each block matched saves one (none for an instance
        over the load cap), then the least loaded, then the first given. Non-empty."""
        loads = {target: self.load(target, busy) for target, busy in in_flight.items()}
        least = min(loads.values())
        cap = max(least + SLACK, int(least * RATIO))
        ranked = [
            (LOAD_BLOCKS * load - (self.matched(blocks, target) if load <= cap else 0), load, index, target)
            for index, (target, load) in enumerate(loads.items())
        ]
        return min(ranked, key=lambda r: r[:3])[3]

    def routed(self, blocks: Sequence[int], target: T) -> None:
        """`target` was sent a request with these blocks: it holds them now, and one more load."""
        if len(self._recent) == self._recent.maxlen:
            oldest = self._recent[0]
            self._routed[oldest] -= 1
            if not self._routed[oldest]:
                del self._routed[oldest]
        self._recent.append(target)
        self._routed[target] += 1
        for block in blocks:
            holders = self._holders.pop(block, ())
            self._holders[block] = (target, *(h for h in holders if h != target))[:HOLDERS]
        while len(self._holders) > self.capacity:
            self._holders.popitem(last=False)

    def forget(self, gone: Callable[[T], bool]) -> None:
        """Instances are gone (their worker lost, their model reloaded): nothing routes to them by
        prefix any more."""
        for block in [b for b, holders in self._holders.items() if any(gone(h) for h in holders)]:
            rest = tuple(h for h in self._holders[block] if not gone(h))
            if rest:
                self._holders[block] = rest
            else:
                del self._holders[block]

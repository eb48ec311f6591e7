"""Sequence slots, backlog and idle timeouts of one sequence-batched model (docs/triton-spec.md §3.4), as pure logic.

A *slot* is one of an instance's `slots_per_instance` places for a live sequence, named
(worker, instance, index). A sequence keeps its slot from START to END (or idle timeout),
so every request of it runs on the same instance of the same worker, in arrival order.
START with no free slot puts the sequence in the backlog; a released slot goes to the
oldest backlogged sequence, with all its queued requests (Triton's `ReleaseSequenceSlot`).

Order is kept by construction: a sequence has at most one request executing at a time,
so whatever the worker's credits and threads, request i+1 starts after request i ended
(and after the implicit state it wrote). This costs nothing Triton does not also pay: a
sequence's requests cannot share a batch anyway.

Idle timeout: a sequence is idle when nothing of it executes and no request has arrived
or finished for `max_sequence_idle_microseconds`. As in Triton, a request that waits longer
than that for its instance (every credit busy) does not keep its sequence alive: size the
idle time above the queueing delay you expect. Unlike Triton the clock restarts when a
backlogged sequence gets its slot (Triton can reap it at once), a sequence never times out
while one of its requests executes, and requests still queued for a timed-out sequence
are answered with an error instead of being dropped (server#4178, #3652).

Every slot is released through `_release`, which is idempotent: a cancelled request, a
lost worker and an END cannot free the same slot twice (core#341).

Scheduler replicas (see `handover`): a replica that gave the model up *freezes* its book (it
keeps the slots its live sequences hold, gives every other slot away and binds no new one),
and the model's new owner *reserves* those slots (it binds none of them until they are given
back), so no slot is ever bound by two replicas.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from services.scheduler.scheduling_records import CorrId, Sequence, SlotKey
from shared.wire.records import shown_name
from shared.wire.status import SlotStatus


@dataclass(frozen=True)
class Admission:
    sequence: Sequence | None  # None: refused
    error: str = ""
    conflict: bool = False  # START for a live id: Triton warns, the old sequence ends early


class SequenceBook:
    def __init__(self, model: str, slots_per_instance: int, idle_s: float) -> None:
        self.model = model
        self.slots_per_instance = slots_per_instance
        self.idle_s = idle_s
        self.live: dict[CorrId, Sequence] = {}  # ids requests can still join (no END yet)
        self.bound: dict[SlotKey, Sequence] = {}  # slot -> the sequence holding it
        self.free: list[SlotKey] = []
        self.backlog: deque[Sequence] = deque()
        self.instances: set[tuple[str, int]] = set()
        self.lost: dict[CorrId, str] = {}  # ids whose sequence died with its worker -> why (bounded)
        self.frozen = False  # the model moved to another replica: no slot is bound or freed here any more
        self.reserved: set[SlotKey] = set()  # slots another replica's live sequences still hold
        # a random start: workers key implicit state by (id, number), and two replicas' books
        # may number sequences on the same instance during a hand-over
        self._numbers = itertools.count(random.randrange(1, 1 << 48))

    # -- instances --------------------------------------------------------------------
    def learn(self, worker: str, instance: int, now: float) -> None:
        """An instance granted a credit: its slots exist (and may take backlogged sequences)."""
        if (worker, instance) in self.instances:
            return
        self.instances.add((worker, instance))
        if self.frozen:  # its slots belong to the model's new owner
            return
        for index in range(self.slots_per_instance):
            self._release_slot((worker, instance, index), now)

    # -- replicas ---------------------------------------------------------------------
    def freeze(self) -> None:
        """The model moved to another replica: keep the slots of the live sequences (backlogged
        ones get them as they end), give every other slot away, and bind no new one."""
        self.frozen = True
        self.free.clear()

    def thaw(self, now: float) -> None:
        """The model came back: every slot not bound here (nor reserved) is free again."""
        self.frozen = False
        for worker, instance in sorted(self.instances):
            for index in range(self.slots_per_instance):
                slot = (worker, instance, index)
                if slot not in self.bound and slot not in self.free:
                    self._release_slot(slot, now)

    def held_slots(self) -> list[SlotKey]:
        return sorted(self.bound)

    def reserve(self, slots: set[SlotKey], now: float) -> list[SlotKey]:
        """`slots` are held by another replica: none is bound here until given back. Returns
        those already bound here (cannot happen when the hand-over protocol is kept)."""
        given_back = self.reserved - slots
        self.reserved = set(slots)
        self.free = [s for s in self.free if s not in self.reserved]
        if not self.frozen:  # a frozen book only keeps track (for when it thaws): it binds nothing new
            for slot in sorted(given_back):
                if slot not in self.bound:
                    self._release_slot(slot, now)
        return sorted(s for s in self.reserved if s in self.bound)

    def lose(self, corrids: Iterable[CorrId], reason: str) -> None:
        """Another replica gave these sequences up: their later requests say why."""
        for corrid in corrids:
            if corrid not in self.live:
                self.lost[corrid] = reason
        self._trim_lost()

    def _trim_lost(self) -> None:
        while len(self.lost) > 10_000:  # a tombstone per lost id, for a clearer error; bounded
            del self.lost[next(iter(self.lost))]

    def forget_worker(self, worker: str, reason: str) -> list[Sequence]:
        """The worker is gone: its slots vanish and the sequences on them are lost."""
        self.instances = {i for i in self.instances if i[0] != worker}
        self.free = [s for s in self.free if s[0] != worker]
        lost = [(key, seq) for key, seq in self.bound.items() if key[0] == worker]
        for key, seq in lost:
            del self.bound[key]
            seq.slot = None
            if self.live.get(seq.corrid) is seq:
                del self.live[seq.corrid]
                self.lost[seq.corrid] = reason
        self._trim_lost()
        return [seq for _, seq in lost]

    # -- requests ---------------------------------------------------------------------
    def admit(self, corrid: CorrId, start: bool, end: bool, item: Any, now: float) -> Admission:
        """Queue one request of a sequence (Triton's `SequenceBatchScheduler::Enqueue`)."""
        seq = self.live.get(corrid)
        if seq is None and not start:
            if corrid in self.lost:
                return Admission(
                    None,
                    f"sequence {corrid} to model '{shown_name(self.model)}' was lost: {self.lost[corrid]}; "
                    "start it again with the START flag",
                )
            return Admission(
                None,
                f"inference request for sequence {corrid} to model '{shown_name(self.model)}' must specify "
                "the START flag on the first request of the sequence",
            )
        conflict = seq is not None and start
        if seq is None:
            self.lost.pop(corrid, None)
            seq = Sequence(corrid, next(self._numbers), active_at=now)
            self._place(seq, now)
        seq.queue.append(item)
        seq.active_at = now
        if end:
            seq.closing = True
            self.live.pop(corrid, None)  # a START+END sequence was never live
        else:
            self.live[corrid] = seq
        return Admission(seq, conflict=conflict)

    def _place(self, seq: Sequence, now: float) -> None:
        if self.free:  # (a frozen book has none: a new sequence waits for one of its own to end)
            # spread sequences over instances: the one with the fewest bound sequences first
            load = {i: 0 for i in self.instances}
            for key in self.bound:
                load[key[:2]] = load.get(key[:2], 0) + 1
            slot = min(self.free, key=lambda s: (load.get(s[:2], 0), s))
            self.free.remove(slot)
            self._bind(seq, slot, now)
        else:
            self.backlog.append(seq)

    def _bind(self, seq: Sequence, slot: SlotKey, now: float) -> None:
        seq.slot = slot
        seq.active_at = now  # a backlogged sequence's idle clock starts when it can run
        self.bound[slot] = seq

    def started(self, seq: Sequence, item: Any, now: float) -> None:
        """`item`, the head of the sequence's queue, was sent to run."""
        seq.queue.popleft()
        seq.running = item
        seq.ran = True
        seq.active_at = now

    def finished(self, seq: Sequence, now: float) -> None:
        seq.running = None
        seq.active_at = now
        if seq.closing and not seq.queue:
            self._release(seq, now)

    def remove(self, seq: Sequence, item: Any, now: float) -> None:
        """A queued request left (cancelled, past its deadline). A cancelled END still ends
        the sequence: it never reopens, and its slot is freed once nothing else is queued."""
        try:
            seq.queue.remove(item)
        except ValueError:
            return
        if seq.closing and not seq.queue and seq.running is None:
            self._release(seq, now)
        elif not seq.queue and seq.running is None and seq.slot is not None and not seq.ran:
            self._release(seq, now)  # its START left before it ran: the sequence never began
        elif not seq.queue and seq.running is None and seq.slot is None and seq in self.backlog:
            self.backlog.remove(seq)  # an empty backlog entry waits for nothing
            if self.live.get(seq.corrid) is seq:
                del self.live[seq.corrid]

    # -- slots ------------------------------------------------------------------------
    def _release(self, seq: Sequence, now: float) -> None:
        """Idempotent: only the sequence's first release frees its slot."""
        if self.live.get(seq.corrid) is seq:
            del self.live[seq.corrid]
        if seq in self.backlog:
            self.backlog.remove(seq)
        slot, seq.slot = seq.slot, None
        if slot is None or self.bound.get(slot) is not seq:
            return
        del self.bound[slot]
        self._release_slot(slot, now)

    def _release_slot(self, slot: SlotKey, now: float) -> None:
        if slot[:2] not in self.instances or slot in self.reserved:
            return
        if self.backlog:
            self._bind(self.backlog.popleft(), slot, now)
        elif not self.frozen:  # a frozen book gives the slot away
            self.free.append(slot)

    def expire_backlog(self, expired: Callable[[Any], bool]) -> list[Sequence]:
        """Backlogged sequences with a request `expired(item)` selects (its `timeout` ran out
        before the sequence got a slot) leave with everything they queued (Triton, direct)."""
        gone = [seq for seq in self.backlog if any(expired(item) for item in seq.queue)]
        for seq in gone:
            self.backlog.remove(seq)
            if self.live.get(seq.corrid) is seq:
                del self.live[seq.corrid]
        return gone

    def expire(self, expired: Callable[[Any], bool], now: float) -> list[tuple[Sequence, Any, SlotKey | None]]:
        """Queued requests `expired(item)` selects (nobody waits for them any more) leave, with
        the slot their sequence held before (a caller tells its worker if it was released); a
        backlogged sequence left with nothing queued gives up its place in the backlog."""
        gone: list[tuple[Sequence, Any, SlotKey | None]] = []
        for seq, item in [(seq, item) for seq, item in self.all_queued() if expired(item)]:
            slot = seq.slot
            self.remove(seq, item, now)
            gone.append((seq, item, slot))
        return gone

    # -- idle timeout -----------------------------------------------------------------
    def idle(self, now: float) -> list[tuple[Sequence, SlotKey]]:
        """Sequences past their idle time: their slot is released; the caller answers what
        they still had queued and tells the worker. Backlogged sequences wait for a slot."""
        expired = [
            (seq, slot)
            for slot, seq in self.bound.items()
            if seq.running is None and now - seq.active_at >= self.idle_s
        ]
        for seq, _ in expired:
            queued = list(seq.queue)
            seq.queue.clear()
            seq.closing = True
            self._release(seq, now)
            seq.queue.extend(queued)  # handed back to the caller to fail
        return expired

    def next_idle_at(self) -> float | None:
        times = [seq.active_at + self.idle_s for seq in self.bound.values() if seq.running is None]
        return min(times) if times else None

    def ready(self, worker: str, instance: int) -> list[Sequence]:
        """Sequences of this instance that have a request to run now, in slot order."""
        return [
            seq
            for key, seq in sorted(self.bound.items(), key=lambda kv: kv[0])
            if key[:2] == (worker, instance) and seq.ready
        ]

    def summary(self) -> SlotStatus:
        """For `shoal status`: how the slots are used."""
        return SlotStatus(
            instances=len(self.instances),
            free_slots=len(self.free),
            bound=len(self.bound),
            live=len(self.live),
            backlog=len(self.backlog),
            reserved=len(self.reserved),
        )

    def queued(self) -> int:
        return sum(len(s.queue) for s in self.bound.values()) + sum(len(s.queue) for s in self.backlog)

    def all_queued(self) -> list[tuple[Sequence, Any]]:
        return [(s, item) for s in list(self.bound.values()) + list(self.backlog) for item in s.queue]

"""Live sequences across a voluntary hand-over of a sequence-batched model between scheduler replicas.

A sequence lives in the book (`SequenceBook`) of the replica that owns its model: slot, order,
the one request running. When fair share moves the model to a joining replica, or its owner
shuts down cleanly, the sequences must neither break nor be served by both replicas.

Design: the old owner keeps its live sequences (their *residue*) until they end, instead of
moving the slot table. Moving the table would need a cut-over of requests queued and running
at the old owner while new ones reach the new owner, with order kept across both; keeping them
where they are keeps every existing guarantee (order, one request at a time, same instance)
by construction, and costs one extra bus hop per request for sequences that were live at the
hand-over, for their remaining lifetime only. The protocol, over `SequenceResidue` broadcasts:

1. Before giving up the lease the old owner announces a residue *in overlap*: during the
   overlap (both replicas in the infer queue group, `HANDOVER_S`) the new owner forwards every
   request of the model's sequences to it, so one replica alone starts and continues
   sequences, as before the hand-over.
2. When the overlap ends the old owner leaves the queue group, freezes its book (it keeps the
   slots its sequences hold and binds no new one) and announces the residue as *final*:
   its slots and live ids. From then on the new owner serves new sequences on the other slots
   (it reserves the residue's), forwards requests of the residue's ids to the old owner, and
   gets each slot back when its sequence ends. A START that reaches the old owner too late (it
   crossed the final announcement) is bounced back with the residue, so it is served by the
   new owner once that owner knows which slots to leave alone.
3. The residue ends when its last sequence ends (END or idle timeout), or at a bound
   (`RESIDUE_MAX_S`, `SHUTDOWN_RESIDUE_S` when the process stops): sequences still live then
   are lost, their queued requests and later ones are told so (`... was lost: ...; start it
   again with the START flag`), never Triton's misleading START-flag error.

A holder that died loses its sequences with the same clear error: at once when a request
forwarded to it finds no one (NATS "no responders"), else once it is silent for `SILENT_S`.
Requests of one sequence stay in order for a client that waits for each response (as sequence
clients do); requests of one sequence sent concurrently during the overlap may reach the two
replicas in either order, as two HTTP connections may reach a single server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Container, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.scheduling_records import CorrId
from services.scheduler.sequences.book import SequenceBook
from services.scheduler.sequences.sequence_batcher import SequenceBatcher, sequence_batcher_of
from shared.bus import connection
from shared.wire import subjects
from shared.wire.messages import ForwardedRequests, RequestHeader, SequenceResidue, encode
from shared.wire.records import shown_name

log = logging.getLogger("shoal.scheduler.handover")

RESIDUE_MAX_S = 120.0  # a replica serves the sequences of a model it handed over for at most this long
SHUTDOWN_RESIDUE_S = 20.0  # ... when it is stopping (keep the orchestrator's grace period above it)
REFRESH_S = 0.5  # a holder repeats its residue this often
SILENT_S = 3.0  # a holder not heard from for this long is gone: its sequences are lost

_residue_decoder = msgspec.msgpack.Decoder(SequenceResidue)
_forwarded_decoder = msgspec.msgpack.Decoder(ForwardedRequests)
_header_decoder = msgspec.msgpack.Decoder(RequestHeader)

Key = tuple[str, int]
Take = Callable[[list[msgspec.Raw], bool], Awaitable[None]]  # queue requests here (`routed`: never forward)


class Queues(Protocol):
    """What the hand-over needs from batching (implemented by `batching.pump.Pump`)."""

    def find(self, key: Key) -> ModelQueue | None: ...
    def of_model(self, model: str) -> list[ModelQueue]: ...
    async def pump(self, queue: ModelQueue) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class Owner(Protocol):
    """Which models this replica serves (implemented by `replicas.ownership.Ownership`)."""

    def owns(self, model: str) -> bool: ...
    def wants(self, model: str) -> bool: ...


@dataclass
class Seen:
    """Another replica's residue, as last announced."""

    residue: SequenceResidue
    ids: set[CorrId] = field(default_factory=set)
    at: float = 0.0  # monotonic


def route(holders: Mapping[str, Seen], live: Container[CorrId], header: RequestHeader) -> str | None:
    """Where a request of a sequence-batched model goes: None to serve it here, else the
    replica (scheduler id) that holds its sequence."""
    if header.sequence_id in live:  # ours (a START for an id live there was bounced back to us)
        return None
    for holder, seen in holders.items():  # an earlier owner still serving this sequence keeps it
        if seen.residue.final and header.sequence_id in seen.ids:
            return holder
    for holder, seen in holders.items():
        if not seen.residue.final:  # the overlap: the old owner alone starts and continues sequences
            return holder
    return None


def busy(book: SequenceBook) -> bool:
    return bool(book.live or book.bound or book.backlog)


class HandOver:
    def __init__(self, nc: NATS, me: str, queues: Queues, owner: Owner, take: Take) -> None:
        self.nc = nc
        self.me = me
        self.queues = queues
        self.owner = owner
        self.take = take
        self.held: dict[Key, bool] = {}  # residues this replica serves -> final
        self.seen: dict[Key, dict[str, Seen]] = {}  # residues of the other replicas

    async def start(self) -> None:
        nc = self.nc
        await nc.subscribe(subjects.SCHEDULER_RESIDUE, cb=self._on_residue)
        await nc.subscribe(subjects.scheduler_sequences(self.me), cb=self._on_forwarded)

    async def run(self) -> None:
        """Repeat what this replica holds (a holder heard from is alive); forget silent holders."""
        while True:
            await asyncio.sleep(REFRESH_S)
            for key in list(self.held):
                await self._announce(key)
            await self._sweep()

    def _keys(self, model: str) -> list[Key]:
        return [q.key for q in self.queues.of_model(model) if sequence_batcher_of(q) is not None]

    def _batcher(self, key: Key) -> SequenceBatcher | None:
        queue = self.queues.find(key)
        return None if queue is None else sequence_batcher_of(queue)

    def _book(self, key: Key) -> SequenceBook | None:
        batcher = self._batcher(key)
        return None if batcher is None else batcher.book

    def worth_keeping(self, model: str) -> bool:
        return any((book := self._book(key)) is not None and busy(book) for key in self._keys(model))

    # -- the old owner ----------------------------------------------------------------
    async def begin(self, model: str) -> None:
        """Called before the lease is given up: during the overlap the new owner sends us every
        request of the model's sequences."""
        for key in self._keys(model):
            self.held[key] = False
            await self._announce(key)

    async def cancel(self, model: str) -> None:
        """The lease came back during the overlap: nothing to hand over."""
        for key in self._keys(model):
            if self.held.pop(key, None) is not None:
                await self._publish(SequenceResidue(model=key[0], version=key[1], holder=self.me, done=True))

    async def regain(self, model: str) -> None:
        """The model came back to us while we still served its residue: serve it as its owner."""
        for key in self._keys(model):
            book = self._book(key)
            if book is not None and book.frozen:
                await self._reserve(key)  # first: thawing must not free slots other replicas hold
                book.thaw(time.monotonic())  # `serve` sees it and ends the residue

    async def lost(self, model: str, reason: str) -> None:
        """We lost the model without handing it over (our lease expired): its live sequences
        end here; the new owner tells their later requests why."""
        for key in self._keys(model):
            book = self._book(key)
            if book is not None and key not in self.held and book.live:
                await self._publish(
                    SequenceResidue(
                        model=key[0], version=key[1], holder=self.me, done=True, lost=list(book.live), reason=reason
                    )
                )

    async def wait(self, timeout_s: float) -> None:
        """On shutdown: let the residues of hand-overs under way end, for at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.held and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def serve(self, model: str, bound_s: float) -> None:
        """The overlap is over: keep the live sequences (and only their slots) until they end,
        for at most `bound_s`; then give up what is left."""
        keys = [k for k in self._keys(model) if k in self.held]
        for key in keys:
            queue, book = self.queues.find(key), self._book(key)
            if queue is None or book is None:
                continue
            book.freeze()
            self.held[key] = True
            await self._announce(key)
            await self.queues.pump(queue)
        deadline = time.monotonic() + bound_s
        while keys:
            for key in list(keys):
                book = self._book(key)
                if not self.owner.wants(model):  # unloaded (what was queued is answered)
                    keys.remove(key)
                    await self._finish(key, f"model '{shown_name(model)}' was unloaded")
                elif book is None or not book.frozen or not busy(book):
                    keys.remove(key)  # ended, or the model was reloaded or came back to us
                    await self._finish(key, "")
                elif time.monotonic() >= deadline:
                    keys.remove(key)
                    await self._finish(
                        key,
                        f"scheduler {self.me} handed model '{shown_name(model)}' over and kept its live "
                        f"sequences for {bound_s:g} s",
                    )
            if keys:
                await asyncio.sleep(0.05)  # sequences end on their own time; this only notices it

    async def _finish(self, key: Key, reason: str) -> None:
        """The residue ends: sequences still live are lost (and told so); the book starts afresh."""
        self.held.pop(key, None)
        queue, batcher = self.queues.find(key), self._batcher(key)
        lost: list[CorrId] = []
        if queue is not None and batcher is not None and batcher.book.frozen:
            lost = await batcher.restart(queue, reason)
            await self._reserve(key)  # the fresh book respects what other replicas hold at once
        if lost:
            log.warning("gave up %d live sequence(s) of model '%s': %s", len(lost), key[0], reason)
        await self._publish(
            SequenceResidue(model=key[0], version=key[1], holder=self.me, done=True, lost=lost, reason=reason)
        )

    def _residue(self, key: Key) -> SequenceResidue | None:
        book = self._book(key)
        if key not in self.held or book is None:
            return None
        return SequenceResidue(
            model=key[0],
            version=key[1],
            holder=self.me,
            final=self.held[key],
            slots=book.held_slots(),
            ids=list(book.live),
        )

    async def _announce(self, key: Key) -> None:
        residue = self._residue(key)
        if residue is not None:
            await self._publish(residue)

    async def _publish(self, residue: SequenceResidue) -> None:
        try:
            await self.nc.publish(subjects.SCHEDULER_RESIDUE, encode(residue))
        except Exception as exc:  # repeated every REFRESH_S
            log.warning("cannot announce the sequences of '%s' this replica holds: %s", residue.model, exc)

    async def _on_forwarded(self, msg: Msg) -> None:
        if msg.reply:  # received (the sender learns from no answer at all that we are gone)
            await msg.respond(b"")
        forwarded = connection.decode(_forwarded_decoder, msg, log)
        if forwarded is None:
            return
        if forwarded.bounced:  # ours to serve: learn the holder's slots first, then queue them here
            for residue in forwarded.residues:
                await self._learn(residue)
            await self.take(forwarded.requests, True)
            return
        keep, back, residues = [], [], {}
        for raw in forwarded.requests:
            try:
                header = _header_decoder.decode(raw)
            except msgspec.DecodeError as exc:
                log.error("undecodable forwarded request from scheduler %s: %s", forwarded.sender, exc)
                continue
            key = (header.model, header.version)
            queue = self.queues.find(key)
            if self._late_start(queue, header):
                back.append(raw)
                announced = self._residue(key)
                if announced is not None:
                    residues[key] = announced
            else:
                keep.append(raw)
        if back:
            bounced = ForwardedRequests(requests=back, sender=self.me, bounced=True, residues=list(residues.values()))
            await self.nc.publish(subjects.scheduler_sequences(forwarded.sender), encode(bounced))
        if keep:
            await self.take(keep, True)

    def _late_start(self, queue: ModelQueue | None, header: RequestHeader) -> bool:
        """A START of a new sequence that reached us after the overlap: the new owner serves it."""
        batcher = None if queue is None else sequence_batcher_of(queue)
        if queue is None or batcher is None or not header.sequence_start:
            return False
        if self.held.get(queue.key) is False:  # the overlap: we still start sequences
            return False
        return header.sequence_id not in batcher.book.live and not self.owner.owns(queue.key[0])

    # -- the new owner (any replica) ------------------------------------------------------
    def route(self, queue: ModelQueue, header: RequestHeader) -> str | None:
        """Where a request goes: None to serve it here (as every request while no other replica
        holds sequences of its model), else the replica holding its sequence."""
        holders = self.seen.get(queue.key)
        if not holders:
            return None
        batcher = sequence_batcher_of(queue)
        return None if batcher is None else route(holders, batcher.book.live, header)

    def forward(self, holder: str, raws: list[msgspec.Raw]) -> None:
        """Send requests to the replica holding their sequences. A request, not a publish, so
        that a holder that died is noticed at once; tasks start in order, so requests leave in
        order (the connection's request inbox exists since the KV buckets were opened)."""
        payload = encode(ForwardedRequests(requests=raws, sender=self.me))
        self.queues.spawn(self._send(holder, raws, payload))

    async def _send(self, holder: str, raws: list[msgspec.Raw], payload: bytes) -> None:
        try:
            await self.nc.request(subjects.scheduler_sequences(holder), payload, timeout=SILENT_S)
        except NoRespondersError:  # it died: its sequences are lost, and these requests are told so here
            await self._gone(holder)
            await self.take(raws, True)
        except Exception as exc:  # it is away or slow: if it died, its silence ends its residue
            log.debug("no acknowledgement from scheduler %s for forwarded requests: %s", holder, exc)

    async def _on_residue(self, msg: Msg) -> None:
        residue = connection.decode(_residue_decoder, msg, log)
        if residue is not None:
            await self._learn(residue)

    async def _learn(self, residue: SequenceResidue) -> None:
        if residue.holder == self.me:
            return
        key = (residue.model, residue.version)
        holders = self.seen.setdefault(key, {})
        if residue.done:
            holders.pop(residue.holder, None)
            self._lose(key, residue.lost, residue.reason)
        else:
            holders[residue.holder] = Seen(residue, set(residue.ids), time.monotonic())
        await self._reserve(key)

    def _lose(self, key: Key, ids: list[CorrId], reason: str) -> None:
        book = self._book(key)
        if ids and book is not None:
            book.lose(ids, reason)

    async def _reserve(self, key: Key) -> None:
        """Bind none of the slots other replicas' sequences hold; take back those they gave up."""
        holders = self.seen.get(key, {})
        if not holders:
            self.seen.pop(key, None)
        queue, book = self.queues.find(key), self._book(key)
        if queue is None or book is None:
            return
        slots = {slot for seen in holders.values() if seen.residue.final for slot in seen.residue.slots}
        clash = book.reserve(slots, time.monotonic())
        if clash:
            log.error("slots %s of model '%s' are bound here and by another replica", clash, key[0])
        await self.queues.pump(queue)

    async def _sweep(self) -> None:
        now = time.monotonic()
        for holders in list(self.seen.values()):
            for holder, seen in list(holders.items()):
                if now - seen.at > SILENT_S:
                    await self._gone(holder)

    async def _gone(self, holder: str) -> None:
        """A holder died: its sequences are lost (their requests are told so) and its slots free."""
        for key, holders in list(self.seen.items()):
            seen = holders.pop(holder, None)
            if seen is None:
                continue
            log.warning(
                "scheduler %s is gone: the %d live sequence(s) of model '%s' it held are lost",
                holder,
                len(seen.ids),
                key[0],
            )
            self._lose(key, list(seen.ids), f"scheduler {holder} stopped responding")
            await self._reserve(key)

"""A client's side of the data path: send a request on the bus, await its response(s).

Used by the gateway for HTTP clients, by workers for BLS requests and by schedulers for
ensemble steps. Each request gets its own reply subject under the caller's inbox, so a
missing scheduler shows up at once as NATS "no responders" instead of a silent timeout.

A scheduler that dies while it holds requests is noticed within about a second (see
shared/bus/holders.py): requests that are safe to send again (not part of a sequence, not
streamed from a decoupled model, deadline not reached) go to another scheduler (or the
restarted one), the others fail at once with a 503 saying why (docs/reliability.md).

The same holds when this process's own connection to NATS drops (its server killed, its host
cut off): what was sent before is presumed lost with the connection. Once reconnected, the
requests safe to send again are sent again and the others fail with a 503 saying why; if the
bus is not back within `BUS_LOSS_GRACE_S`, every request in flight fails with a 503 then, and new
ones fail at once until it is back. Nothing is left to its deadline.

A model can be READY while no scheduler replica serves it for a moment: at start, while a lease
moves (a replica died, rebalancing) or after a reconnect, until a replica claims the lease and
subscribes (services/scheduler/replicas/leases.py). NATS then answers "no responders": nobody
received the request, so any request (sequence and decoupled ones too) is sent again, backing
off, for up to `SCHEDULER_WAIT_S` within its deadline; only then does it fail with a 503 saying
why (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from shared.bus import connection, dispatch_stream, eager, hot_path
from shared.bus.holders import Holders
from shared.bus.tensor_store import TensorStore
from shared.errors import ShoalError, unavailable
from shared.wire import subjects
from shared.wire.deadlines import seconds_left
from shared.wire.messages import (
    BatchDoneView,
    CancelRequest,
    HeldGroups,
    InferRequest,
    InferResponse,
    InstanceFree,
    RequestBatch,
    RequestDeadline,
    ResponseBatchView,
    encode,
)
from shared.wire.records import shown_name

log = logging.getLogger("shoal.gateway")
BUS_LOSS_GRACE_S = 3.0  # a lost NATS connection not back by then: the requests in flight fail
NOT_RESENT = "a sequence or decoupled request is not sent again: retry it"
# a dead replica's leases expire after leases.TTL_S (4 s) and are claimed on a later round: twice that
SCHEDULER_WAIT_S = 8.0
RETRY_FIRST_S, RETRY_MAX_S = 0.02, 0.5  # sent again after this, doubling: a claim takes one refresh round
NO_SCHEDULER = "no scheduler is serving requests"
_response_decoder = msgspec.msgpack.Decoder(InferResponse)


_batch_decoder = msgspec.msgpack.Decoder(ResponseBatchView)
_done_decoder = msgspec.msgpack.Decoder(BatchDoneView)
_held_decoder = msgspec.msgpack.Decoder(HeldGroups)
_deadline_decoder = msgspec.msgpack.Decoder(RequestDeadline)


def _groups(requests: list[tuple[str, bytes]], budget: int) -> Iterator[list[tuple[str, bytes]]]:
    """Consecutive runs of encoded requests whose bytes fit one message."""
    group: list[tuple[str, bytes]] = []
    size = 0
    for item in requests:
        if group and size + len(item[1]) > budget:
            yield group
            group, size = [], 0
        group.append(item)
        size += len(item[1])
    if group:
        yield group


def _expire(future: asyncio.Future[InferResponse]) -> None:
    if not future.done():
        future.set_exception(unavailable("Request timeout expired"))


class LocalScheduler(Protocol):
    """A scheduler replica in this process (services/scheduler/cohosted.py)."""

    def owns(self, model: str) -> bool: ...  # holds the model's lease: its requests come here
    async def take(self, requests: list[msgspec.Raw]) -> None: ...
    async def completed(self, free: InstanceFree) -> None: ...  # a batch it sent is done


class Dispatcher:
    def __init__(
        self,
        nc: NATS,
        gateway_id: str,
        store: TensorStore,
        local: LocalScheduler | None = None,
        loaded: Callable[[str], bool] | None = None,
    ) -> None:
        self.nc = nc
        self.local = local
        # whether a model is still loaded, so that a scheduler will serve it: a request for a model
        # unloaded meanwhile (evicted) fails at once instead of waiting for a scheduler (None: wait)
        self.loaded = loaded
        self.inbox = subjects.gateway_inbox(gateway_id)
        self.store = store
        self._pending: dict[
            str, asyncio.Future[InferResponse] | asyncio.Queue[InferResponse]
        ] = {}  # rid -> one answer, or a stream
        self._ids = itertools.count()
        self._outbox: dict[str, list[tuple[str, bytes]]] = {}
        self._flush_scheduled = False
        self._groups: dict[str, list[str]] = {}
        self._prefix = gateway_id
        # rid -> (model, encoded request, safe to send again, connection epoch it was sent in):
        # kept while the request is pending
        self._sent: dict[str, tuple[str, bytes, bool, int]] = {}
        self.holders = Holders(nc, self._recover)
        # requests sent again, by (model, why): "scheduler_lost" (its scheduler died), "bus_reconnect"
        # (this process's NATS connection dropped after they were sent), "no_scheduler" (none served
        # the model yet: sent until one does); /metrics shows them
        self.resent: Counter[tuple[str, str]] = Counter()
        self._epoch = 0  # connections lost so far: a request sent in an earlier epoch went with one
        self._down_since: float | None = None
        # rid -> (when NATS first found no scheduler for it, its next send) while it waits for one
        self._unserved: dict[str, tuple[float, asyncio.TimerHandle | None]] = {}

    async def start(self) -> None:
        await hot_path.subscribe(self.nc, f"{self.inbox}.*", self._on_reply)
        await self.nc.subscribe(subjects.SCHEDULER_RECONNECTED, cb=self._scheduler_reconnected)
        connection.on_connection(self.nc, self._bus_lost, self._bus_back)
        self.holders.start()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def new_rid(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def reply_subject(self, rid: str) -> str:
        return f"{self.inbox}.{rid}"

    async def infer(self, request: InferRequest, timeout: float) -> InferResponse:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferResponse] = loop.create_future()
        self._pending[request.rid] = future
        # a timer on the future itself: cheaper than asyncio.wait_for's wrapping per request
        timer = loop.call_later(timeout, _expire, future)
        try:
            self._enqueue(request, not request.sequence_id)
            return await future
        except asyncio.CancelledError:  # the client went away: take the request out of its queue
            await self.cancel(request)
            raise
        finally:
            timer.cancel()
            self._forget(request.rid)

    def stream(self, request: InferRequest, timeout: float) -> AsyncIterator[InferResponse]:
        """The responses of a decoupled model's request, until the one flagged final (the
        generator is `dispatch_stream.py`'s: mypyc compiles no async generator)."""
        return dispatch_stream.responses(self, request, timeout)

    def open_stream(self, request: InferRequest) -> asyncio.Queue[InferResponse]:
        """A streamed request sent, and the queue its responses arrive in."""
        queue: asyncio.Queue[InferResponse] = asyncio.Queue()
        self._pending[request.rid] = queue
        try:
            self._enqueue(request, False)  # never sent again: a decoupled model may have responded already
        except BaseException:
            self._forget(request.rid)
            raise
        return queue

    async def close_stream(self, request: InferRequest, queue: asyncio.Queue[InferResponse], finished: bool) -> None:
        """A stream's end: the model's work stopped unless its final response came (the client went
        away or gave up), and the responses nobody will read released."""
        self._forget(request.rid)
        if not finished:
            await self.cancel(request)
        while not queue.empty():
            await self.store.release_remote(queue.get_nowait().outputs)

    async def cancel(self, request: InferRequest) -> None:
        """Tell the scheduler and the model running it that nobody wants `request` any more: it
        leaves its queue, a python model sees `is_cancelled()`. A stream still open keeps
        receiving what the model sends until its final response (a BLS `cancel()`)."""
        cancel = CancelRequest(request.rid, request.model, request.version)
        await self.nc.publish(subjects.SCHEDULER_CANCEL, encode(cancel))

    def _forget(self, rid: str) -> None:
        self._pending.pop(rid, None)
        self._sent.pop(rid, None)
        self.holders.done(rid)
        if self._unserved:
            waiting = self._unserved.pop(rid, None)
            if waiting is not None and waiting[1] is not None:
                waiting[1].cancel()

    def _enqueue(self, request: InferRequest, resendable: bool) -> None:
        raw = encode(request)
        self._sent[request.rid] = (request.model, raw, resendable, self._epoch)
        self._send(request.model, request.rid, raw)

    def _send(self, model: str, rid: str, raw: bytes) -> None:
        """Requests started in one event-loop iteration leave as one message per model."""
        self._outbox.setdefault(model, []).append((rid, raw))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(lambda: eager.start(self._flush()))

    async def _flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        budget = max(64 * 1024, self.nc.max_payload - 64 * 1024)
        for model, requests in outbox.items():
            for group in _groups(requests, budget):
                await self._publish_group(model, group)
        if len(self._groups) > 65536:  # groups no scheduler acknowledged (it died): forget old ones
            for key in list(self._groups)[:32768]:
                del self._groups[key]

    async def _publish_group(self, model: str, requests: list[tuple[str, bytes]]) -> None:
        down = self._down_since
        if down is not None and time.monotonic() - down > BUS_LOSS_GRACE_S:  # not buffered for an outage
            lost_for = time.monotonic() - down
            self._fail([rid for rid, _ in requests], unavailable(f"no connection to NATS for {lost_for:.0f}s"))
            return
        local = self.local
        if local is not None and local.owns(model):  # a function call; it dies with this process
            try:
                await local.take([msgspec.Raw(raw) for _, raw in requests])
            except Exception as exc:  # never lose a request: the ones not answered fail now
                log.exception("the co-hosted scheduler could not take %d request(s)", len(requests))
                self._fail([rid for rid, _ in requests], unavailable(f"the scheduler failed: {exc}"))
            return
        batch_id = f"g{next(self._ids)}"
        # the reply subject only carries NATS "no responders" back for the whole group
        self._groups[batch_id] = [rid for rid, _ in requests]
        self.holders.sent(self._groups[batch_id])
        payload = encode(RequestBatch([msgspec.Raw(raw) for _, raw in requests]))
        try:
            outgoing = hot_path.Outgoing(subjects.infer(model), payload, f"{self.inbox}.{batch_id}")
            await hot_path.publish_all(self.nc, [outgoing])  # with the rest of this turn's, one write
        except Exception as exc:  # not connected, payload too large: fail these requests now
            self._fail(self._groups.pop(batch_id), unavailable(f"cannot reach the scheduler: {exc}"))

    def _held(self, msg: Msg) -> None:
        held_by = msg.headers.get(subjects.HELD_BY_HEADER) if msg.headers else None
        held: HeldGroups | None = connection.decode(_held_decoder, msg, log)
        if not held_by or held is None:
            return
        rids = [rid for group in held.groups for rid in self._groups.pop(group, ()) if rid in self._pending]
        self.holders.held(held_by, rids)

    async def _scheduler_reconnected(self, msg: Msg) -> None:
        held_by = msg.headers.get(subjects.HELD_BY_HEADER) if msg.headers else None
        if held_by:
            self.holders.reconnected(held_by)

    def _fail(self, rids: list[str], exc: ShoalError) -> None:
        for rid in rids:
            waiter = self._pending.get(rid)
            if isinstance(waiter, asyncio.Queue):
                waiter.put_nowait(InferResponse(rid, error=exc.message, code=str(exc.code)))
            elif waiter is not None and not waiter.done():
                waiter.set_exception(exc)

    async def _recover(self, holder: str, rids: list[str], dead: bool = True) -> None:
        """The scheduler holding `rids` died (`dead`), or they were on their way to one whose
        connection to NATS was lost: send the safe ones again, fail the others now."""
        unsafe = []
        for rid in rids:
            sent = self._sent.get(rid)
            if sent is None or rid not in self._pending:
                continue
            model, raw, resendable, _ = sent
            if resendable:
                self.resent[(model, "scheduler_lost")] += 1
                self._send(model, rid, raw)
            else:
                unsafe.append(rid)
        why = "stopped responding" if dead else "lost its connection to NATS while the request was on its way"
        self._fail(unsafe, unavailable(f"the scheduler holding the request {why}; {NOT_RESENT}"))

    # -- this process's own connection to NATS ------------------------------------------
    def _bus_lost(self) -> None:
        self._epoch += 1
        self._down_since = time.monotonic()
        epoch = self._epoch
        asyncio.get_running_loop().call_later(BUS_LOSS_GRACE_S, self._bus_still_lost, epoch)

    def _bus_still_lost(self, epoch: int) -> None:
        if self._down_since is None or epoch != self._epoch:
            return  # back meanwhile (or lost again: that loss has its own timer)
        rids = list(self._pending)
        if rids:
            log.warning("NATS not back after %.0fs: failing %d request(s) in flight", BUS_LOSS_GRACE_S, len(rids))
        self._fail(rids, unavailable(f"the connection to NATS was lost and is not back after {BUS_LOSS_GRACE_S:.0f}s"))

    def _bus_back(self) -> None:
        """What was sent before the connection dropped may have been lost with it (in the server,
        or its answer on the way back): send the safe requests again, fail the others now."""
        self._down_since = None
        unsafe, again = [], 0
        for rid, (model, raw, resendable, epoch) in list(self._sent.items()):
            if epoch == self._epoch or rid not in self._pending:
                continue  # sent while reconnecting: nats-py held it and sends it now
            waiting = self._unserved.get(rid)
            if waiting is not None and waiting[1] is not None:
                continue  # no scheduler had it: its own timer sends it again
            if self.local is not None and self.local.owns(model):
                continue  # queued in this process: its scheduler asks the workers what they hold (reconnected)
            if resendable:
                self.resent[(model, "bus_reconnect")] += 1
                again += 1
                self._sent[rid] = (model, raw, resendable, self._epoch)
                self._send(model, rid, raw)
            else:
                unsafe.append(rid)
        if unsafe or again:
            log.warning("reconnected to NATS: %d request(s) in flight sent again, %d failed", again, len(unsafe))
        self._fail(
            unsafe, unavailable(f"the connection to NATS was lost while the request was in flight; {NOT_RESENT}")
        )

    async def _on_reply(self, msg: Msg) -> None:
        token = msg.subject.rsplit(".", 1)[1]
        if token == "held":  # a scheduler took these groups: watch it until their requests are answered
            self._held(msg)
            return
        if msg.headers and msg.headers.get("Status") == "503":  # NATS: no subscriber got them
            self._no_scheduler(self._groups.pop(token, [token]))
            return
        if token == "done":
            await self.batch_done(msg.data)
            return
        try:
            if token == "batch":
                responses = _batch_decoder.decode(msg.data).responses
            else:
                responses = [_response_decoder.decode(msg.data)]
        except msgspec.DecodeError as exc:
            log.error("undecodable response on %s: %s", msg.subject, exc)
            return
        await self._resolve(responses)

    async def batch_done(self, data: bytes) -> None:
        """A `BatchDone` for the co-hosted scheduler: from the inbox, or a worker's local channel."""
        try:
            done = _done_decoder.decode(data)
        except msgspec.DecodeError as exc:
            log.error("undecodable batch completion: %s", exc)
            return
        await self._resolve(done.responses)
        if self.local is not None:  # the answers first, then the credit
            await self.local.completed(done.free)
        else:  # sent to this inbox's previous process, which co-hosted a scheduler: every scheduler gets it
            await self.nc.publish(subjects.INSTANCE_FREE, encode(done.free))

    def _no_scheduler(self, rids: list[str]) -> None:
        """Nobody received these: send each again after a pause (a replica may be claiming the
        model's lease), or fail it once `SCHEDULER_WAIT_S` or its deadline would be passed."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        give_up: dict[str, str] = {}
        for rid in rids:
            sent = self._sent.get(rid)
            if sent is None or rid not in self._pending:
                continue
            self.holders.done(rid)  # not held by anyone: no scheduler to watch
            model = sent[0]
            if self.loaded is not None and not self.loaded(model):
                give_up[rid] = f"{NO_SCHEDULER} for model '{shown_name(model)}': it is no longer loaded"
                continue
            if rid not in self._unserved:
                self.resent[(model, "no_scheduler")] += 1
            first = self._unserved.get(rid, (now, None))[0]
            waited = now - first
            delay = min(RETRY_MAX_S, max(RETRY_FIRST_S, waited))
            left_s = seconds_left(_deadline_decoder.decode(sent[1]).deadline_ns)
            if waited + delay > SCHEDULER_WAIT_S or delay + RETRY_FIRST_S >= left_s:
                give_up[rid] = (
                    f"{NO_SCHEDULER} for model '{shown_name(model)}' (waited {waited:.1f}s; is the scheduler running?)"
                )
                continue
            self._unserved[rid] = (first, loop.call_later(delay, self._send_again, rid))
        for rid, why in give_up.items():
            self._unserved.pop(rid, None)
            self._fail([rid], unavailable(why))

    def _send_again(self, rid: str) -> None:
        waiting = self._unserved.get(rid)
        sent = self._sent.get(rid)
        if waiting is None or sent is None or rid not in self._pending:
            return
        self._unserved[rid] = (waiting[0], None)
        model, raw, resendable, _ = sent
        self._sent[rid] = (model, raw, resendable, self._epoch)  # sent in this connection
        self._send(model, rid, raw)

    async def _resolve(self, responses: list[InferResponse]) -> None:
        for response in responses:
            future = self._pending.get(response.rid)
            if isinstance(future, asyncio.Queue):
                future.put_nowait(response)
            elif future is None or future.done():
                # Late (the client gave up): free the outputs nobody will read.
                await self.store.release_remote(response.outputs)
            else:
                future.set_result(response)

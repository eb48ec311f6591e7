"""The scheduler's spans of a batch with traced requests (OpenTelemetry trace mode).

One bus message and one batch mix requests of different traces, so each request carries its own
context (`RequestHeader.traceparent`: its model span at the gateway) and gets its own `queue`
span under it: from its arrival here to its batch leaving, with the batch it left in and why.
The batch itself is one span, `batch`: a child of its first traced request's span, linked to the
span of every traced request in it (OpenTelemetry span links), from its sending to its
completion (the worker's `InstanceFree`). Each `queue` span links to it.
"""

from __future__ import annotations

import time

from services.scheduler.scheduling_records import Key, Pending, Slot
from shared.tracing.spans import Span, Tracing


def batch_sent(tracing: Tracing, key: Key, slot: Slot, batch: list[Pending], batch_id: int, reason: str) -> Span | None:
    """The spans of a batch sent now, or None if no request in it is traced: the `batch` span
    (still open: `batch_done` ends it) and each traced request's `queue` span (ended now)."""
    traced = [p for p in batch if p.header.traceparent]
    if not traced:
        return None
    now = time.monotonic_ns()
    carriers = [(p.header.traceparent, p.header.tracestate) for p in traced]
    attributes: dict[str, str | int] = {
        "triton.model_name": key[0],
        "triton.model_version": key[1],
        "shoal.batch.id": batch_id,
        "shoal.batch.reason": reason,
        "shoal.batch.size": sum(p.batch_size for p in batch),
        "shoal.batch.requests": len(batch),
        "shoal.batch.traced_requests": len(traced),
        "shoal.worker": slot.worker,
        "shoal.instance": slot.instance,
    }
    span = tracing.start("batch", carriers[0], now, attributes, links=carriers)
    link = [tracing.carrier(span)]
    for pending, carrier in zip(traced, carriers):
        queued = tracing.start("queue", carrier, pending.enqueued_ns or now, attributes, links=link)
        tracing.event(queued, "QUEUE_START", pending.enqueued_ns or now)
        tracing.end(queued, now)
    return span


def batch_done(tracing: Tracing, span: Span, error: str = "") -> None:
    tracing.end(span, time.monotonic_ns(), error)

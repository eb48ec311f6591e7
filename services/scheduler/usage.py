"""What on-demand eviction must know from the schedulers: which models are in use, and when each
was last used.

A model is in use while a request waits in its queue, a batch of it runs, or a sequence holds
one of its slots (live, or waiting in the backlog): evicting it would fail those. The repository
gathers this from every scheduler replica before it picks what to evict (docs/models.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.sequences.sequence_batcher import sequence_batcher_of
from shared.wire.control import ModelUsage


def holds_sequences(queue: ModelQueue) -> bool:
    batcher = sequence_batcher_of(queue)
    if batcher is None:
        return False
    book = batcher.book
    return bool(book.bound or book.live or book.backlog or book.reserved)


def model_usage(
    queues: Iterable[ModelQueue], owns: Callable[[str], bool], idle: Callable[[str], bool]
) -> dict[str, ModelUsage]:
    """Per model this replica serves: in use or not, and when last used."""
    usage: dict[str, ModelUsage] = {}
    for queue in queues:
        model = queue.key[0]
        if not owns(model):
            continue
        entry = usage.setdefault(model, ModelUsage(busy=not idle(model)))
        entry.busy = entry.busy or holds_sequences(queue)
        entry.last_used_ms = max(entry.last_used_ms, queue.stats.last_inference_ms)
    return usage

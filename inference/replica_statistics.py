"""Every scheduler replica's statistics, merged: the statistics extension and /metrics read these."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable

import msgspec
from nats.aio.client import Client as NATS

from inference import statistics_merge as merge
from shared.bus import connection
from shared.errors import unavailable
from shared.wire import subjects
from shared.wire.statistics import ModelStatistics, ReplicaCount, SchedulerStatistics

log = logging.getLogger("shoal.gateway")
_decoder = msgspec.msgpack.Decoder(SchedulerStatistics)

_count_decoder = msgspec.msgpack.Decoder(ReplicaCount)


def replicas_declared(reply: bytes) -> int:
    """How many scheduler replicas a reply says there are (0: it cannot say, or is unreadable)."""
    try:
        return _count_decoder.decode(reply).replicas
    except msgspec.DecodeError:
        return 0


async def scheduler_stats(nc: NATS, payload: bytes = b"") -> SchedulerStatistics:
    """Every scheduler replica's statistics for the models it serves, merged. Each reply says how
    many replicas its sender counts, and the gather waits for that many (a second at most after
    the first): on a loaded machine a replica's reply comes late, and a sum without it is wrong."""
    replies = await connection.gather(nc, subjects.SCHEDULER_STATS, payload, declared=replicas_declared)
    if not replies:
        raise unavailable("the scheduler is not available")
    decoded = [stats for stats in map(_decoded, replies) if stats is not None]
    if not decoded:  # every reply was malformed (logged): as if none had answered
        raise unavailable("the scheduler is not available")
    return functools.reduce(merge.scheduler_statistics, decoded)


def _decoded(reply: bytes) -> SchedulerStatistics | None:
    """One replica's reply, or None (logged): a malformed one never fails the whole call."""
    try:
        return _decoder.decode(reply)
    except msgspec.DecodeError as exc:  # msgspec.ValidationError is one
        log.error("undecodable statistics reply from a scheduler: %s", exc)
        return None


def model_entries(
    stats: SchedulerStatistics, models: list[str], ready_versions: Callable[[str], Iterable[int]], version: str = ""
) -> list[ModelStatistics]:
    """The statistics extension's `model_stats` list: one entry per ready version of `models`
    (all-zero for a version no scheduler has served yet)."""
    entries = []
    for model in models:
        for v in ready_versions(model):
            if version and v != int(version):
                continue
            entry = stats.versions.get(f"{model}/{v}")
            entries.append(entry.stats if entry is not None else ModelStatistics(model, str(v)))
    return entries

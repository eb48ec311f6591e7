"""Every scheduler replica's statistics, merged: the statistics extension and /metrics read these."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable

import msgspec
from nats.aio.client import Client as NATS

from inference import statistics_merge as merge
from shared.bus import connection
from shared.errors import unavailable
from shared.wire import subjects
from shared.wire.statistics import ModelStatistics, SchedulerStatistics

log = logging.getLogger("shoal.gateway")
_decoder = msgspec.msgpack.Decoder(SchedulerStatistics)

_replicas = {"count": 0, "learned": 0.0}  # scheduler replicas that answered a full gather, and when


async def scheduler_stats(nc: NATS, payload: bytes = b"") -> SchedulerStatistics:
    """Every scheduler replica's statistics for the models it serves, merged.

    Waiting for a quiet moment costs a few ms per call, so the replica count from the last
    full gather (renewed every second, so new replicas are seen) ends the wait early."""
    fresh = time.monotonic() - _replicas["learned"] < 1.0
    replies = await connection.gather(
        nc, subjects.SCHEDULER_STATS, payload, expected=int(_replicas["count"]) if fresh else 0
    )
    if not replies:
        raise unavailable("the scheduler is not available")
    if not fresh:
        _replicas.update(count=len(replies), learned=time.monotonic())
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

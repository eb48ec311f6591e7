"""Every scheduler replica's statistics, merged: the statistics extension and /metrics read these."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from shared import bus
from shared.errors import unavailable
from shared.wire import subjects
from shared.wire.statistics import model_stats_doc

_replicas = {"count": 0, "learned": 0.0}  # scheduler replicas that answered a full gather, and when


async def scheduler_stats(nc: NATS, payload: bytes = b"") -> dict[str, Any]:
    """Every scheduler replica's statistics for the models it serves, merged.

    Waiting for a quiet moment costs a few ms per call, so the replica count from the last
    full gather (renewed every second, so new replicas are seen) ends the wait early."""
    fresh = time.monotonic() - _replicas["learned"] < 1.0
    replies = await bus.gather(nc, subjects.SCHEDULER_STATS, payload, expected=int(_replicas["count"]) if fresh else 0)
    if not replies:
        raise unavailable("the scheduler is not available")
    if not fresh:
        _replicas.update(count=len(replies), learned=time.monotonic())
    merged: dict[str, Any] = {}
    for reply in replies:
        for key, value in msgspec.json.decode(reply).items():
            merged[key] = merge_stats(merged[key], value) if key in merged else value
    return merged


_NOT_ADDED = {"quantiles", "first_response_buckets", "free_credits", "cache_enabled"}


def merge_stats(a: Any, b: Any, key: str = "") -> Any:
    """Two replicas' statistics of one model version (a model served by one, then another):
    counts and durations add up, `last_inference` is the later, quantiles are not added."""
    if key in _NOT_ADDED:
        return a or b
    if key == "last_inference":
        return max(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge_stats(a[k], b[k], k) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    if isinstance(a, list) and isinstance(b, list):
        if all(isinstance(x, dict) and "batch_size" in x for x in a + b):  # batch_stats: by size
            sizes: dict[int, Any] = {}
            for entry in a + b:
                size = entry["batch_size"]
                sizes[size] = merge_stats(sizes[size], entry) if size in sizes else entry
            return [dict(v, batch_size=k) for k, v in sorted(sizes.items())]
        if len(a) == len(b) and all(isinstance(x, (int, float)) for x in a + b):  # histogram counts
            return [x + y for x, y in zip(a, b)]
        return a if len(a) >= len(b) else b
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a or b
    return a + b


def model_entries(
    stats: dict[str, Any], models: list[str], ready_versions: Any, version: str = ""
) -> list[dict[str, Any]]:
    """The statistics extension's `model_stats` list: one entry per ready version of `models`
    (all-zero for a version no scheduler has served yet)."""
    entries = []
    for model in models:
        for v in ready_versions(model):
            if version and v != int(version):
                continue
            entry = stats.get(f"{model}/{v}", {}).get("stats")
            entries.append(entry or model_stats_doc(model, str(v)))
    return entries

"""Shoal's model-management metrics, from the repository: each loaded model's measured memory,
the workers' budgets, and on-demand loads, evictions and thrash (docs/models.md)."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client as NATS

from services.gateway.metrics.prometheus_text import family_lines
from shared.wire import subjects
from shared.wire.control import ModelFigures


async def fetch(nc: NATS, timeout_s: float = 2.0) -> ModelFigures | None:
    """The repository's figures; None when it does not answer (the scrape goes on without them)."""
    try:
        reply = await nc.request(subjects.REPOSITORY_MODELS, b"", timeout=timeout_s)
        return msgspec.json.decode(reply.data, type=ModelFigures)
    except Exception:
        return None


def render(figures: ModelFigures | None) -> list[str]:
    if figures is None:
        return []
    memory = [
        ({"model": m.model, "version": str(m.version), "worker": m.worker, "kind": kind}, value)
        for m in figures.memory
        for kind, value in (("rss", m.rss), ("device", m.device))
        if value
    ]
    budgets = [({"worker": w}, b.bytes) for w, b in figures.budgets.items() if b.bytes]
    limits = [({"worker": w}, b.models) for w, b in figures.budgets.items() if b.models]
    evictions = [({"model": e.model, "reason": e.reason}, e.count) for e in figures.evictions]
    loads = [({"model": m}, n) for m, n in sorted(figures.loads.items())]
    thrash = [({"model": m}, n) for m, n in sorted(figures.thrash.items())]
    lines: list[str] = []
    for name, doc, kind, samples in (
        ("shoal_model_memory_bytes", "Memory a loaded model's instances took at load, per worker", "gauge", memory),
        ("shoal_worker_model_memory_budget_bytes", "A worker's --model-memory-budget", "gauge", budgets),
        ("shoal_worker_max_loaded_models", "A worker's --max-loaded-models", "gauge", limits),
        ("shoal_model_loads_total", "Models loaded on demand by a request", "counter", loads),
        ("shoal_model_evictions_total", "Models evicted to make room, by reason", "counter", evictions),
        (
            "shoal_model_thrash_total",
            "Models requested again within --thrash-window of their eviction (the budget is too small)",
            "counter",
            thrash,
        ),
    ):
        if samples:
            lines += family_lines(name, doc, kind, samples)
    return lines

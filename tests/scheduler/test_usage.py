"""What a scheduler tells on-demand eviction (services/scheduler/usage.py)."""

from __future__ import annotations

from services.scheduler.batching.dynamic import DynamicBatcher
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.usage import model_usage
from shared.wire.control import ModelUsage


def queue(model: str, version: int = 1) -> ModelQueue:
    return ModelQueue((model, version), DynamicBatcher(host=None))  # never pumped: no host


def test_usage_of_the_models_this_replica_serves() -> None:
    idle, running, elsewhere = queue("idle"), queue("running"), queue("other")
    idle.stats.last_inference_ms = 1_000
    usage = model_usage([idle, running, elsewhere], lambda m: m != "other", lambda m: m != "running")
    assert usage == {
        "idle": ModelUsage(busy=False, last_used_ms=1_000),
        "running": ModelUsage(busy=True, last_used_ms=0),
    }


def test_two_versions_are_one_model_busy_if_either_is() -> None:
    v1, v2 = queue("m", 1), queue("m", 2)
    v1.stats.last_inference_ms, v2.stats.last_inference_ms = 5, 9
    assert model_usage([v1, v2], lambda m: True, lambda m: True) == {"m": ModelUsage(busy=False, last_used_ms=9)}

"""Triton's per-model-version statistics document (the statistics extension's schema).

The scheduler fills it; the gateway answers it (and an all-zero one for a version no
scheduler has served yet), so its shape lives here, on the wire, not in either service.
"""

from __future__ import annotations

from typing import Any

INFERENCE_STATS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


def model_stats_doc(
    name: str,
    version: str,
    last_inference: int = 0,
    inference_count: int = 0,
    execution_count: int = 0,
    inference_stats: dict[str, dict[str, int]] | None = None,
    batch_stats: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    durations = inference_stats or {}
    return {
        "name": name,
        "version": version,
        "last_inference": last_inference,
        "inference_count": inference_count,
        "execution_count": execution_count,
        "inference_stats": {k: durations.get(k, {"count": 0, "ns": 0}) for k in INFERENCE_STATS},
        "response_stats": {},
        "batch_stats": batch_stats or [],
        "memory_usage": [],
    }

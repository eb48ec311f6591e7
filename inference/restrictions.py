"""Triton's API groups for restricted access (`--http-restricted-api`, `--grpc-restricted-protocol`):
one list for every front end, each of which maps its own routes or RPCs onto it."""

from __future__ import annotations

CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

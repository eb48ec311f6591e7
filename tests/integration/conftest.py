"""Fixtures several integration modules share."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.utils.shared_memory as shm

from tests.cluster import SHAPES, Running, running_cluster


@pytest.fixture(scope="module", params=SHAPES)
def shape(request: pytest.FixtureRequest) -> str:
    """The scheduling modules run in both cluster shapes: each gateway hosting a scheduler replica
    (the default) and standalone scheduler processes (tests/cluster.py, docs/design.md)."""
    return str(request.param)


@pytest.fixture
def regions() -> Iterator[Callable[[int], tuple[str, Any]]]:
    """Make client system shared-memory regions (key, handle) that are destroyed after the test."""
    made = []

    def make(byte_size: int) -> tuple[str, Any]:
        key = f"/client_test_{uuid.uuid4().hex[:8]}"
        handle = shm.create_shared_memory_region(key.lstrip("/"), key, byte_size)
        made.append(handle)
        return key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="module")
def with_shm(test_repository: Any) -> Iterator[Running]:
    """A cluster that allows client shared memory (`--allow-client-shm`), one per module."""
    with running_cluster(test_repository, allow_client_shm=True) as running:
        yield running


@pytest.fixture(scope="module")
def perf_analyzer() -> str:
    """Triton's perf_analyzer (benchmarks/get_perf_analyzer.sh fetches it); skipped, saying why, where it cannot be."""
    root = Path(__file__).resolve().parents[2]
    binary = root / "benchmarks" / ".tools" / "perf_analyzer"
    if not binary.exists():
        fetched = subprocess.run(
            ["bash", str(root / "benchmarks" / "get_perf_analyzer.sh")], capture_output=True, text=True, timeout=600
        )
        if fetched.returncode != 0 or not binary.exists():
            pytest.skip(f"perf_analyzer could not be fetched: {fetched.stderr[-500:]}")
    return str(binary)

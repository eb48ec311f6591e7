"""Large tensors: POSIX shared memory on one host, chunks over the bus otherwise; nothing leaks."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.cluster import running_cluster
from tests.serving import wait_until

BIG = (1, 16 * 2**20)  # 64 MiB of FP32


def no_segments_left(run_id: str, timeout: float = 5.0) -> None:
    """The run's shared-memory segments are all gone within `timeout`."""

    def found() -> list[str]:
        return glob.glob(f"/dev/shm/shoal_{run_id}_*")

    wait_until(lambda: not found(), timeout, "no segment left", 0.05, detail=found)


def round_trip(url: str, value: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=120, connection_timeout=120)
    try:
        tensor = httpclient.InferInput("INPUT0", list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        return client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_64mib_through_shared_memory(shoal):
    value = np.random.default_rng(3).standard_normal(BIG).astype(np.float32)
    np.testing.assert_array_equal(round_trip(shoal.url, value), value)
    no_segments_left(shoal.cluster.run_id)


def test_medium_tensor_crosses_inline_threshold(shoal):
    for width in (16383, 16384, 16385, 100_000):  # around and above the 64 KiB inline limit
        value = np.arange(width, dtype=np.float32).reshape(1, width)
        np.testing.assert_array_equal(round_trip(shoal.url, value), value)
    no_segments_left(shoal.cluster.run_id)


@pytest.fixture(scope="module")
def bus_only(test_repository):
    """Shared memory switched off and a small max_payload: tensors travel in many chunks."""
    with running_cluster(
        test_repository, transport="bus", max_payload=256 * 1024, http_max_input_size=80 * 2**20
    ) as running:
        yield running


def test_64mib_over_the_bus_in_chunks(bus_only):
    value = np.random.default_rng(4).standard_normal(BIG).astype(np.float32)
    np.testing.assert_array_equal(round_trip(bus_only.url, value), value)
    assert glob.glob(f"/dev/shm/shoal_{bus_only.cluster.run_id}_*") == []


def test_small_and_medium_over_the_bus(bus_only):
    for width in (4, 70_000, 300_000):
        value = np.arange(width, dtype=np.float32).reshape(1, width)
        np.testing.assert_array_equal(round_trip(bus_only.url, value), value)


async def test_many_inline_sized_requests_batch_within_the_message_limit(shoal):
    """32 requests of 60 KB each (under the inline limit) form batches bigger than NATS' 1 MiB."""
    import asyncio

    import tritonclient.http.aio as aioclient

    client = aioclient.InferenceServerClient(shoal.url, conn_limit=32)
    try:

        async def one(i: int) -> None:
            value = np.full((1, 15000), i, np.float32)
            tensor = aioclient.InferInput("INPUT0", [1, 15000], "FP32")
            tensor.set_data_from_numpy(value)
            result = await client.infer("identity_fp32", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), value)

        await asyncio.gather(*(one(i) for i in range(32)))
    finally:
        await client.close()

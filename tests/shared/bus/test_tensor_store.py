"""TensorStore against a real nats-server: inline, shared memory, chunked bus fetch, release."""

from __future__ import annotations

import os

import numpy as np
import pytest

from shared.bus import connection
from shared.bus.tensor_store import TensorStore
from shared.process.natsserver import NatsServer


@pytest.fixture(scope="module")
def nats_url():
    with NatsServer(max_payload=64 * 1024) as server:
        yield server.url


@pytest.fixture(params=["auto"])
async def pair(nats_url, request):
    """A producing and a consuming TensorStore, each on its own connection."""
    conns = [await connection.connect(nats_url, f"test-{role}") for role in ("producer", "consumer")]
    stores = [
        TensorStore(nc, role, inline_max=1024, transport=request.param)
        for nc, role in zip(conns, ("producer", "consumer"))
    ]
    for store in stores:
        await store.start()
    yield stores
    for store in stores:
        await store.close()
    for nc in conns:
        await nc.close()


bus_only = pytest.mark.parametrize("pair", ["bus"], indirect=True)


async def test_inline_and_shared_memory(pair):
    producer, consumer = pair
    small = producer.put("s", "UINT8", [10], bytes(range(10)), ttl_s=10)
    assert small.data == bytes(range(10)) and not small.shm
    payload = np.arange(100_000, dtype=np.float32)
    ref = producer.put("b", "FP32", [100_000], memoryview(payload).cast("B"), ttl_s=10)
    assert ref.shm and os.path.exists(f"/dev/shm/{ref.shm.lstrip('/')}")
    got = await consumer.get(ref, timeout=5)
    np.testing.assert_array_equal(np.frombuffer(got, np.float32), payload)
    await consumer.release_remote([ref])
    assert not os.path.exists(f"/dev/shm/{ref.shm.lstrip('/')}")


@bus_only
async def test_chunked_fetch_and_release(pair):
    producer, consumer = pair
    payload = np.random.default_rng(0).integers(0, 255, 1_000_003, dtype=np.uint8)  # ~16 chunks of 60 KiB
    ref = producer.put("b", "UINT8", [payload.size], payload.tobytes(), ttl_s=10)
    assert not ref.shm and ref.key
    got = await consumer.get(ref, timeout=5)
    assert bytes(got) == payload.tobytes()
    await consumer.release_remote([ref])
    with pytest.raises(RuntimeError, match="released or expired"):
        for _ in range(100):  # the release is asynchronous: wait for it with a bound
            await consumer.get(ref, timeout=5)


async def test_shared_memory_on_another_host_is_fetched_over_the_bus(pair):
    producer, consumer = pair
    consumer.host = "another-host"
    payload = bytes(range(256)) * 1000
    ref = producer.put("b", "UINT8", [len(payload)], payload, ttl_s=10)
    assert ref.shm
    assert bytes(await consumer.get(ref, timeout=5)) == payload
    await consumer.release_remote([ref])
    producer.free([ref])

"""shared/bus/buckets.py's sweep of old KV delete markers, against a real nats-server."""

from __future__ import annotations

import nats
import pytest

from shared.bus import buckets, nats_internals


@pytest.fixture
async def nc(nats_server):
    connection = await nats.connect(nats_server.url)
    yield connection
    await connection.close()


async def test_old_delete_markers_go_and_keys_written_again_stay(nc):
    kv = await buckets.bucket(nc, "markers")
    for i in range(5):
        await kv.create(f"r{i}", b"x")
        await kv.delete(f"r{i}")
    await kv.put("r0", b"again")
    assert await buckets.purge_old_markers(kv, 3600) == 0  # none that old
    assert await buckets.purge_old_markers(kv, 0) == 4
    state = (await nc.jetstream().stream_info("KV_markers")).state
    assert state.messages == 1
    assert (await kv.get("r0")).value == b"again"
    assert await buckets.list_keys(kv) == ["r0"]


async def test_a_purge_up_to_a_marker_keeps_what_was_written_after_it(nc):
    kv = await buckets.bucket(nc, "rewritten")
    await kv.create("r", b"x")
    await kv.delete("r")
    marker = (await nc.jetstream().stream_info("KV_rewritten")).state.last_seq
    await kv.put("r", b"again")  # between the sweep's look and its purge
    await nats_internals.purge_key(kv, "r", before=marker + 1)
    assert (await kv.get("r")).value == b"again"
    assert (await nc.jetstream().stream_info("KV_rewritten")).state.messages == 1

"""inference/shm.py's checks of a client's system shared-memory key: only a segment of /dev/shm by
its own name, never one of Shoal's, a link, or anything the gateway's user cannot open as Triton
does (Triton's statuses and texts)."""

from __future__ import annotations

import asyncio
import os
import posixpath
import time
import uuid
from collections.abc import Iterator

import nats
import posix_ipc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference import shm
from inference.shm import check_key, segment_size
from shared.errors import Code, ShoalError
from shared.wire import subjects


@given(st.text(st.sampled_from("/.\0abshoal_-x"), max_size=12))
def test_an_accepted_key_names_a_file_directly_in_dev_shm_and_none_of_shoals(key: str) -> None:
    try:
        check_key("r", key)
    except ShoalError as exc:
        assert exc.code in (Code.INVALID_ARG, Code.INTERNAL)
        return
    bare = key.lstrip("/")
    path = posixpath.normpath(f"/dev/shm/{bare}")
    assert posixpath.dirname(path) == "/dev/shm" and posixpath.basename(path) == bare
    assert "\0" not in bare and not bare.startswith(("shoal_", "shoal-"))


@pytest.fixture
def segment() -> Iterator[str]:
    key = f"/client_unit_{uuid.uuid4().hex[:8]}"
    made = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=4096)
    made.close_fd()
    yield key
    made.unlink()


def test_a_segment_by_its_own_name_has_its_size(segment: str) -> None:
    assert segment_size("r", segment) == 4096


def test_a_hard_link_to_a_segment_is_refused(segment: str) -> None:
    alias = f"/dev/shm/{segment.lstrip('/')}_alias"
    os.link(f"/dev/shm/{segment.lstrip('/')}", alias)
    try:
        with pytest.raises(ShoalError, match="the segment has 2 names") as err:
            segment_size("r", segment)
        assert err.value.code == Code.INVALID_ARG
    finally:
        os.unlink(alias)


def test_a_fifo_or_a_missing_key_is_refused_at_once() -> None:
    fifo = f"/dev/shm/client_unit_fifo_{uuid.uuid4().hex[:8]}"
    os.mkfifo(fifo)  # opening one for reading alone would wait for a writer
    try:
        for key in (fifo.removeprefix("/dev/shm"), "/client_unit_absent"):
            with pytest.raises(ShoalError, match="Unable to open shared memory region") as err:
                segment_size("r", key)
            assert err.value.code == Code.INTERNAL
    finally:
        os.unlink(fifo)


async def test_unregistered_regions_leave_no_marker_behind(nats_server, segment: str, monkeypatch) -> None:
    """A client that names every region anew (benchmarks/soak_resources.py) grew the regions bucket
    by one delete marker per region for ever: the gateways sweep old markers away."""
    monkeypatch.setattr(shm, "MARKER_SWEEP_S", 0.05)
    monkeypatch.setattr(shm, "MARKER_KEEP_S", 0.0)
    nc = await nats.connect(nats_server.url)
    registry = shm.ShmRegistry(nc, "host", enabled=True)
    await registry.start()
    try:
        for i in range(3):
            await registry.register_system(f"r{i}", {"key": segment, "byte_size": 64})
            await registry.unregister("system", f"r{i}")
        await registry.register_system("kept", {"key": segment, "byte_size": 64})
        stream, deadline = f"KV_{subjects.SHM_BUCKET}", time.monotonic() + 30
        while (await nc.jetstream().stream_info(stream)).state.messages != 1:  # only "kept"'s
            assert time.monotonic() < deadline, "the delete markers are still there"
            await asyncio.sleep(0.05)
        assert registry.status("system") == [{"name": "kept", "key": segment, "offset": 0, "byte_size": 64}]
    finally:
        await registry.stop()
        await nc.close()

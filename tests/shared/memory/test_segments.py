"""shared/memory/segments.py: what Shoal puts in /dev/shm is its user's only, whatever the umask,
and the host id is trusted only when this user alone made it."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

import pytest

from shared.memory import segments


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_a_tensor_segment_is_private_even_under_umask_0() -> None:
    with umask(0):
        name = segments.create_segment(b"tensor bytes")
    try:
        info = os.stat(f"/dev/shm/{name.lstrip('/')}")
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
        assert bytes(segments.map_segment(name, 0, 12)) == b"tensor bytes"
    finally:
        segments.unlink_segment(name)


@pytest.fixture
def host_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> str:
    """The host id in a directory of this test's own (the real /dev/shm one is every test's)."""
    monkeypatch.setattr(segments, "_HOST_FILE", str(tmp_path / "shoal-host-id"))
    return segments.host_file()


def test_the_host_id_is_this_users_own_and_stable(host_file: str) -> None:
    assert host_file.endswith(f"shoal-host-id-{os.geteuid()}")
    with umask(0):
        token = segments.host_token()
    assert len(token) == 32 and segments.host_token() == token  # made once, then read
    assert stat.S_IMODE(os.stat(host_file).st_mode) == 0o600
    assert os.listdir(os.path.dirname(host_file)) == [os.path.basename(host_file)]  # no draft left


def test_a_host_id_others_may_change_or_a_link_is_not_trusted(host_file: str, tmp_path) -> None:
    with open(host_file, "w") as f:
        f.write("chosen-by-someone-else")
    os.chmod(host_file, 0o666)
    first, second = segments.host_token(), segments.host_token()
    assert first.startswith("no-shm-") and first != second  # shares memory with no other process
    os.unlink(host_file)
    (tmp_path / "elsewhere").write_text("chosen-by-someone-else")
    os.chmod(tmp_path / "elsewhere", 0o600)
    os.symlink(tmp_path / "elsewhere", host_file)
    assert segments.host_token().startswith("no-shm-")


def test_a_host_id_of_another_user_is_not_trusted(host_file: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can make a file another user owns")
    with open(host_file, "w") as f:
        f.write("chosen-by-someone-else")
    os.chmod(host_file, 0o600)
    os.chown(host_file, 65534, 65534)
    assert segments.host_token().startswith("no-shm-")


def test_a_fifo_in_place_of_the_host_id_is_refused_at_once(host_file: str) -> None:
    os.mkfifo(host_file, 0o600)  # opened for reading alone, it would wait for a writer for ever
    assert segments.host_token().startswith("no-shm-")

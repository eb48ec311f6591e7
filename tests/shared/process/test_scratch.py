"""shared/process/scratch.py: a scratch directory whose maker is gone is removed by the next one made;
those of running processes, and those without an owner file, are not."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shared.process import scratch


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def made_by_a_process_that_exited(tmp) -> str:
    code = "from shared.process import scratch; print(scratch.make('shoal-test-'))"
    env = {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    return done.stdout.strip()


def test_a_directory_whose_maker_exited_goes_with_the_next_one_made(tmp):
    left = made_by_a_process_that_exited(tmp)
    assert os.path.isdir(left)
    mine = scratch.make("shoal-test-", "model")
    assert not os.path.exists(left)
    owner = (mine / scratch.OWNER).read_text().splitlines()
    assert mine.name.startswith("shoal-test-model-") and owner[0] == scratch.identity(os.getpid())


def test_running_makers_unowned_directories_and_other_kinds_stay(tmp):
    mine = scratch.make("shoal-test-")
    unowned = tmp / "shoal-test-older"
    unowned.mkdir()
    other_kind = made_by_a_process_that_exited(tmp).replace("shoal-test-", "shoal-other-")
    os.rename(made_by_a_process_that_exited(tmp), other_kind)
    assert scratch.sweep("shoal-test-") == []
    assert mine.is_dir() and unowned.is_dir() and os.path.isdir(other_kind)


def test_a_reused_pid_is_not_its_maker(tmp):
    """A process that started later under the same pid does not keep the directory."""
    path = tmp / "shoal-test-reused"
    path.mkdir()
    (path / scratch.OWNER).write_text(f"{os.getpid()} 1\n{scratch._where()}\n")  # this pid, another start time
    assert scratch.sweep("shoal-test-") == [path] and not path.exists()


def test_a_maker_in_another_pid_namespace_is_not_judged_from_here(tmp):
    """Containers sharing /tmp: a pid of theirs means nothing here, even one that runs nothing here."""
    left = made_by_a_process_that_exited(tmp)
    owner = os.path.join(left, scratch.OWNER)
    pid_line, where = Path(owner).read_text().splitlines()
    with open(owner, "w") as out:
        out.write(f"{pid_line}\n{where.replace('pid:[', 'pid:[9')}\n")  # another pid namespace
    assert scratch.sweep("shoal-test-") == [] and os.path.isdir(left)


def test_identity_reads_the_process_start_time():
    me = scratch.identity(os.getpid())
    assert me is not None and me.split()[0] == str(os.getpid()) and me == scratch.identity(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert scratch.identity(child.pid) is None


def test_a_scratch_directory_is_its_users_only_whatever_the_umask(tmp):
    old = os.umask(0)
    try:
        made = scratch.make("shoal-test-")
    finally:
        os.umask(old)
    assert made.stat().st_mode & 0o777 == 0o700  # its files (a nats-server's store, overrides) with it

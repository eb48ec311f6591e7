from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shared.process import cache_dirs


def test_every_cache_path_is_under_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dirs.root() == tmp_path / "shoal"
    paths = [cache_dirs.example_models(), cache_dirs.python_environments(), cache_dirs.serve_records()]
    assert all(path.parent == tmp_path / "shoal" for path in paths)
    assert len({path.name for path in paths}) == 3


def test_without_xdg_cache_home_it_is_the_home_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dirs.root() == tmp_path / ".cache" / "shoal"


def test_a_private_dir_is_its_users_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        made = cache_dirs.private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert made == tmp_path / "a" / "b" and stat.S_IMODE(made.stat().st_mode) == 0o700
    os.chmod(made, 0o755)  # as an older Shoal left it: tightened
    assert stat.S_IMODE(cache_dirs.private_dir(made).stat().st_mode) == 0o700


def test_a_cache_dir_another_user_owns_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user")
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(cache_dirs.NotPrivate, match=r"belongs to another user \(uid 65534\)"):
        cache_dirs.private_dir(tmp_path / "theirs")

from __future__ import annotations

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

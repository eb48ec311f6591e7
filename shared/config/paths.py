"""Reading only inside a directory: no `..`, no absolute paths, no symlink escapes."""

from __future__ import annotations

from pathlib import Path

from shared.errors import invalid


def inside(root: Path, relative: str) -> Path:
    """`root / relative`, refused unless it resolves (symlinks followed) inside `root`."""
    if not relative or Path(relative).is_absolute():
        raise invalid(f"invalid path '{relative}': must be relative to the model directory")
    base = root.resolve()
    target = (root / relative).resolve()
    if target != base and base not in target.parents:
        raise invalid(f"invalid path '{relative}': it leads outside the model directory")
    return target

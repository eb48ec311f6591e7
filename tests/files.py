"""Files changed behind Shoal's back, as the integrity tests change them (docs/security.md, "Model
files"): in a later tick of the file system's clock, with the old modification time put back."""

from __future__ import annotations

import os
import time
from pathlib import Path


def next_tick(path: Path) -> None:
    """Wait until the file system's clock (coarse: a few ms a tick) is past `path`'s change time, so
    that a change now gives it another one (docs/security.md: a change within the tick of the check)."""
    probe, deadline = path.with_name(".tick"), time.monotonic() + 10
    while time.monotonic() < deadline:
        probe.write_bytes(b"")
        moved = probe.stat().st_ctime_ns > path.stat().st_ctime_ns
        probe.unlink()
        if moved:
            return
    raise AssertionError("the file system's clock did not move in 10 s")


def rewrite_keeping_times(path: Path, data: bytes) -> None:
    """What someone hiding a change does: same size, the old modification time put back."""
    next_tick(path)
    before = path.stat()
    os.chmod(path, 0o600)
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

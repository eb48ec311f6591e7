"""Scratch directories in the system's temporary directory that a crash leaves behind only until
the next start.

The process that makes one writes who it is into it: its pid and start time (so that a reused pid
does not pass for it), and where that pid means something: the boot, the pid namespace and the host.
Making one of a kind first removes the directories of that kind whose maker is gone: a SIGKILLed `shoal serve` or PyTriton script leaves its nats-server's JetStream store
(`shoal-nats-*`) and its repository's override files (`shoal-override-*`) behind until the next one
starts, instead of for good. Directories without the owner file (made by an older Shoal, or being
made right now) are never touched, nor are those of another user's processes, nor those made in
another pid namespace, boot or host sharing the directory (containers sharing /tmp, a shared
$TMPDIR): a pid there says nothing about the process here.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

OWNER = ".shoal-owner"


def make(kind: str, label: str = "", parent: Path | None = None) -> Path:
    """A new directory `<tmp>/<kind><label>-XXXXXXXX` (or in `parent`: a runtime directory shared
    by containers, say), after removing the abandoned ones of `kind` there."""
    sweep(kind, parent)
    path = Path(tempfile.mkdtemp(prefix=f"{kind}{label}-" if label else kind, dir=parent))
    written = path / f"{OWNER}.new"
    written.write_text(f"{identity(os.getpid()) or os.getpid()}\n{_where()}\n")
    os.replace(written, path / OWNER)  # a sweeper reads the whole owner or none
    return path


def sweep(kind: str, parent: Path | None = None) -> list[Path]:
    """Remove the directories of `kind` whose maker no longer runs; returns them."""
    removed = []
    for path in (parent or Path(tempfile.gettempdir())).glob(f"{kind}*"):
        if abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def abandoned(path: Path) -> bool:
    try:
        owner, where = (path / OWNER).read_text().splitlines()
        pid = int(owner.split()[0])
    except (OSError, ValueError, IndexError):  # no owner file (yet), not ours to read, not a directory
        return False
    if where != _where():  # its pid is another namespace's, boot's or host's: no judging it from here
        return False
    now = identity(pid)
    return now is None or now != owner


def _where() -> str:
    """This process's boot, pid namespace and host: where a pid names the same process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        boot = namespace = ""
    return f"{boot} {namespace} {socket.gethostname()}"


def identity(pid: int) -> str | None:
    """`"<pid> <start time>"` of a running process; None when none runs with that pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # Linux: no such process
        return str(pid) if running(pid) else None  # no /proc (macOS): the pid alone
    except OSError:
        return str(pid) if running(pid) else None
    # the command name in parentheses may hold spaces: count the fields after its last ')'
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def running(pid: int) -> bool:
    """Whether a process has this pid (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process, alive
    return True

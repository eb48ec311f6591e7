"""What a worker checks before it loads a model version from this host's cache: every file against
the SHA-256 the repository published for it (`ModelRecord.files`), and the model's directory
against the file list (docs/security.md, "Model files").

A file is hashed once per process, then known by its stamp (device, inode, size, modification and
change times): the worker that fetched a file hashed its bytes as they came (shared/bus/file_store.py)
and does not read it again; another worker process of the host reads it once when it first uses it.
The change time is in the stamp because nobody but the kernel sets it: a file rewritten and given
its old modification time back (`touch -d`) still has a new stamp, and is hashed again.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

from shared.wire.records import ModelFile

Stamp = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns
BLOCK = 4 << 20
READS = 3  # a file that changes while each of this many reads of it is refused


def stamp_of(info: os.stat_result) -> Stamp:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class Verified:
    """The files this process found matching their digests, by stamp (thread-safe: checks run on
    threads, off the event loop)."""

    def __init__(self) -> None:
        self._known: dict[Stamp, str] = {}
        self._lock = threading.Lock()

    def remember(self, path: Path, digest: str) -> None:
        """`path` holds `digest`'s bytes: they were hashed as they were written (a fetch), or it is
        a new link to a file just checked (a link changes the change time, not the bytes)."""
        info = os.lstat(path)
        with self._lock:
            self._known[stamp_of(info)] = digest

    def check(self, path: Path, digest: str, size: int) -> bool:
        """Whether `path` is a regular file (not a link to one) of `size` bytes with SHA-256 `digest`.
        Blocking: reads the whole file unless this process checked it unchanged before."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO: refused, not waited on
        except OSError:
            return False
        try:
            for _ in range(READS):
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                    return False
                with self._lock:
                    if self._known.get(stamp_of(info)) == digest:
                        return True
                found = _sha256(fd)
                # unchanged while read (another worker linking it into a tree changes its change time)
                if stamp_of(os.fstat(fd)) == stamp_of(info):
                    break
            else:
                return False
        finally:
            os.close(fd)
        if found != digest:
            return False
        with self._lock:
            self._known[stamp_of(info)] = digest
        return True


def _sha256(fd: int) -> str:
    hasher = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while block := os.read(fd, BLOCK):
        hasher.update(block)
    return hasher.hexdigest()


def tree_problem(tree: Path, files: list[ModelFile], verified: Verified) -> str:
    """What is wrong with the model directory `tree` for `files`: a file that is not one of them,
    is missing, is a symbolic link, or does not match its digest. Empty when nothing is. Blocking."""
    wanted = {f.path: f for f in files}
    seen: set[str] = set()
    for root, dirs, names in os.walk(tree):
        for name in dirs:
            if os.path.islink(os.path.join(root, name)):
                return f"'{Path(root, name).relative_to(tree).as_posix()}' is a symbolic link"
        for name in names:
            relative = Path(root, name).relative_to(tree).as_posix()
            file = wanted.get(relative)
            if file is None:
                return f"'{relative}' is not one of the model's files"
            if not verified.check(Path(root, name), file.digest, file.size):
                return f"'{relative}' does not match the SHA-256 the repository published (sha256:{file.digest})"
            seen.add(relative)
    missing = sorted(wanted.keys() - seen)
    return f"'{missing[0]}' is missing" if missing else ""

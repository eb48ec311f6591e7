"""POSIX shared-memory segments: the tensors Shoal's processes hand each other on one host, and
the regions clients register (Triton's shared-memory extension), mapped, written and unlinked."""

from __future__ import annotations

import logging
import mmap
import os
import stat
import uuid

import posix_ipc

from shared.errors import Code, ShoalError
from shared.wire.messages import TensorRef

_HOST_FILE = "/dev/shm/shoal-host-id"

log = logging.getLogger(__name__)


def region_too_small(name: str, region: TensorRef, nbytes: int) -> ShoalError:
    """Triton's error for an output whose shared-memory region cannot hold it."""
    return ShoalError(
        f"shared memory size specified with the request for output '{name}' ({region.nbytes} bytes) "
        f"should be at least {nbytes} bytes to hold the results",
        Code.INTERNAL,
    )


def segment_prefix() -> str:
    """Segments carry the run id so `shoal serve` can sweep its leftovers on exit."""
    return f"shoal_{os.environ.get('SHOAL_RUN_ID', 'x')}_"


def host_file() -> str:
    """This user's host id: one per user, so that another user's Shoal on the host neither reads
    nor decides it (docs/security.md, "Shared memory")."""
    return f"{_HOST_FILE}-{os.geteuid()}"


def host_token() -> str:
    """An id shared by every process of this user that sees the same /dev/shm (same host or IPC
    namespace). Written once, whole (a link to a finished file), 0600; one that another user made
    or may change is not trusted: this process then shares memory with no other (a token of its own)."""
    path = host_file()
    try:
        _publish_host_id(path)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO put there must not hang us
    except OSError:
        return f"no-shm-{uuid.uuid4().hex}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            log.warning(
                "%s is not this user's own (uid %d, mode %o): not sharing memory", path, info.st_uid, info.st_mode
            )
            return f"no-shm-{uuid.uuid4().hex}"
        return os.read(fd, 64).decode(errors="replace").strip() or f"no-shm-{uuid.uuid4().hex}"
    finally:
        os.close(fd)


def _publish_host_id(path: str) -> None:
    """Create the host id file unless it is there: written under a name of its own, then linked
    into place, so that no process reads it half written (a link never replaces a file)."""
    if os.path.lexists(path):
        return
    draft = f"{path}.{uuid.uuid4().hex}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, uuid.uuid4().hex.encode())
    finally:
        os.close(fd)
    try:
        os.link(draft, path)
    except FileExistsError:
        pass  # another process of this host published it first
    finally:
        os.unlink(draft)


def map_segment(name: str, offset: int, nbytes: int, writable: bool = False) -> memoryview:
    """Map `nbytes` of a shared-memory segment; the mapping lives as long as the view."""
    if nbytes == 0:
        return memoryview(b"")
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW
    fd = os.open(f"/dev/shm/{name.lstrip('/')}", flags)
    try:
        # a segment shorter than asked (truncated by its owner) would SIGBUS on access
        if os.fstat(fd).st_size < offset + nbytes:
            raise ValueError(f"shared memory segment '{name}' is smaller than offset {offset} + {nbytes} bytes")
        page = offset - offset % mmap.ALLOCATIONGRANULARITY
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        mapped = mmap.mmap(fd, nbytes + offset - page, access=access, offset=page)
    finally:
        os.close(fd)
    return memoryview(mapped)[offset - page : offset - page + nbytes]


def unlink_segment(name: str) -> None:
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


def create_segment(payload: memoryview | bytes) -> str:
    name = f"/{segment_prefix()}{uuid.uuid4().hex}"
    view = memoryview(payload).cast("B")
    # this user's only: another user of the host can neither map nor link it (mode set, not left to the umask)
    segment = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=len(view))
    try:
        # reserve the pages now: a full /dev/shm must fail here (ENOSPC), not SIGBUS in the copy
        if len(view):
            os.posix_fallocate(segment.fd, 0, len(view))
        with mmap.mmap(segment.fd, len(view)) as mapped:
            mapped[:] = view
    except BaseException:
        segment.unlink()
        raise
    finally:
        segment.close_fd()
    return name


def write_region(region: TensorRef, payload: memoryview | bytes, host: str) -> bool:
    """Write into a client's registered region if this process can reach it; False if not."""
    nbytes = memoryview(payload).nbytes
    if region.cuda_handle:
        from shared.memory import cuda_shm

        cuda_shm.write(region.cuda_handle, region.device_id, region.offset, payload)
        return True
    if region.host != host:
        return False
    if nbytes:
        map_segment(region.shm, region.offset, nbytes, writable=True)[:] = memoryview(payload).cast("B")
    return True

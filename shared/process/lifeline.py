"""Child processes that die with the process that started them, even when it is SIGKILLed.

Linux's PR_SET_PDEATHSIG makes the kernel send a signal to a child when its parent thread
exits. `shoal serve` starts its services and nats-server with it, so a supervisor that
crashes or is SIGKILLed leaves no orphan holding the ports (issue 17). The signal follows
the *thread* that forked, not the process: `popen` therefore forks every child from one
spawner thread that lives as long as the process, whichever thread asks (a supervising
thread, a test's worker thread).

A child also gets the network namespace of the thread that forks it, and the spawner thread, made
when the first child is asked for, starts in that of the thread that asked: one that had entered
another namespace (setns: a thread of tests/hosts.py's hosts) would have every later child, a later
test's nats-server say, start in that namespace. The spawner therefore forks from the process's own
network namespace (its main thread's), whichever thread made it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets SIGKILL when this process dies.

    Everything is resolved before the fork: between fork and exec the child only calls
    prctl and getppid (no imports, no allocation-heavy work, safe with threads)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        _arm(prctl, parent)

    return preexec


def die_with(parent_pid: int) -> None:
    """The same, from inside a child its parent started otherwise (a python model's process,
    started by its worker or forked by the zygote): SIGKILL when `parent_pid` dies. 0: no parent."""
    prctl = _prctl()
    if parent_pid and prctl is not None:
        _arm(prctl, parent_pid)


def _arm(prctl: Callable[..., int], parent: int) -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _home_network() -> None:
    """Move the calling thread into the process's own network namespace if it is elsewhere."""
    try:
        home, here = os.readlink("/proc/self/ns/net"), os.readlink("/proc/thread-self/ns/net")
    except OSError:  # no /proc (not Linux), or the main thread has exited
        return
    if home == here:
        return
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"the spawner thread cannot leave {here} for {home}")
    finally:
        os.close(fd)


_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shoal-spawner", initializer=_home_network)


def popen(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen(args, **kwargs) for a child that dies with this process (binary pipes),
    in the process's own network namespace whichever thread asks."""

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(args, preexec_fn=die_with_parent(), **kwargs)

    return _spawner.submit(start).result()

"""shared/process/lifeline.py's `die_with`: a process its parent started without `popen` (a python
model's process) arms the kernel's parent-death signal itself, and dies with that parent even when
the parent is SIGKILLed. And `popen`'s children start in the process's own network namespace, even
when the first to ask was a thread in another one (tests/hosts.py's hosts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.hosts import PREFIX, ip, namespaces_refused
from tests.serving import wait_until

CHILD = """
import sys, time
from shared.process import lifeline
lifeline.die_with(int(sys.argv[1]))
print("armed", flush=True)
time.sleep(600)
"""
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline() == "armed\\n"
print(child.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped yet (a container's init may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_that_armed_itself_dies_when_its_parent_is_sigkilled():
    with subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True) as parent:
        try:
            child = int(parent.stdout.readline())
            assert not gone(child)
            parent.send_signal(signal.SIGKILL)
            parent.wait()
            wait_until(lambda: gone(child), what="the child to die with its parent")
        finally:
            parent.kill()


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    # a pid that is not its parent's: as if the parent had died before the signal was armed
    code = "import os; from shared.process import lifeline; lifeline.die_with(os.getppid() + 1); print('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")


def test_no_parent_to_die_with_arms_nothing():
    code = "from shared.process import lifeline; lifeline.die_with(0); print('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "alive\n")


ASKERS = """
import os, subprocess, sys, threading
from shared.process import lifeline
from tests.hosts import enter

def child_namespace() -> str:
    child = lifeline.popen(["readlink", "/proc/self/ns/net"], stdout=subprocess.PIPE)
    return child.communicate(timeout=30)[0].decode().strip()

found = []
def asker() -> None:  # the first to ask, from inside another network namespace
    enter(sys.argv[1])
    found.append(child_namespace())
thread = threading.Thread(target=asker)
thread.start()
thread.join()
print(os.readlink("/proc/self/ns/net"), found[0], child_namespace())
"""


def test_children_start_in_the_process_network_namespace_whichever_thread_asked_first():
    """The spawner thread is made when the first child is asked for: made by a thread that had
    entered a host's namespace, it used to start every later child there (a later module's
    nats-server listened where the test could not reach it)."""
    refused = namespaces_refused()
    if refused:
        pytest.skip(refused)
    namespace = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}-lifeline"
    ip("netns", "add", namespace)
    try:
        done = subprocess.run([sys.executable, "-c", ASKERS, namespace], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        own, first, later = done.stdout.split()
        assert (first, later) == (own, own)
    finally:
        ip("netns", "del", namespace)

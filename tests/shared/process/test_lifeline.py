"""shared/process/lifeline.py's `die_with`: a process its parent started without `popen` (a python
model's process) arms the kernel's parent-death signal itself, and dies with that parent even when
the parent is SIGKILLed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

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

"""What a python model's process does to itself when it starts (forked by the zygote or started on
its own): take its model's name (nats-py without aiohttp: shared/bus/nats_import.py; dying with
the worker that started it: shared/process/lifeline.py's `die_with`). A leaf: the zygote, the worker and
`shoal worker` import it, and it imports nothing of theirs."""

from __future__ import annotations

import contextlib
import ctypes

PR_SET_PDEATHSIG = 1


PR_SET_NAME = 15


def process_name(model: str, index: int) -> str:
    """What `ps -o comm`, `top` and /proc/PID/comm show for a python model's process: `py<i>:<model>`
    for instance i, `py:<model>` for a whole model (the kernel keeps 15 bytes). A forked process's
    command line is its zygote's, so this is what tells them apart."""
    return (f"py{index}:" if index >= 0 else "py:") + model


def name_process(name: str) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)

"""What a python model's process does to itself when it starts (forked by the zygote or started on
its own): take its model's name, import nats-py without aiohttp (dying with the worker that
started it is shared/process/lifeline.py's `die_with`). A leaf: the zygote, the worker and
`shoal worker` import it, and it imports nothing of theirs."""

from __future__ import annotations

import contextlib
import ctypes
import sys

PR_SET_PDEATHSIG = 1


def import_nats_without_websockets() -> None:
    """Called by a child worker before anything imports nats-py: nats-py imports aiohttp at once for
    websocket connections (about 10 MB resident and 0.7 s of CPU per process), which a python
    model's process never makes (it connects as its parent did, over nats:// or tls://). aiohttp is
    hidden while nats-py is imported, then unhidden: a model that imports it gets it."""
    if "aiohttp" in sys.modules:
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # `import aiohttp` raises ImportError
    try:
        import nats.aio.transport  # noqa: F401  (its `aiohttp` stays None)
    finally:
        if "aiohttp" in sys.modules and sys.modules["aiohttp"] is None:
            del sys.modules["aiohttp"]


PR_SET_NAME = 15


def process_name(model: str, index: int) -> str:
    """What `ps -o comm`, `top` and /proc/PID/comm show for a python model's process: `py<i>:<model>`
    for instance i, `py:<model>` for a whole model (the kernel keeps 15 bytes). A forked process's
    command line is its zygote's, so this is what tells them apart."""
    return (f"py{index}:" if index >= 0 else "py:") + model


def name_process(name: str) -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)

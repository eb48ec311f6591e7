"""A storage emulator (moto's S3, gcp-storage-emulator, Azurite) as a child process on a free port:
started with its output in a log, waited for until it listens, stopped at the end of the `with`.
The clouds' own helpers (tests/s3.py, tests/gcs.py, tests/azurite.py) say what to start."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from shared.process import lifeline
from shared.process.natsserver import free_port, wait_for_port


@contextlib.contextmanager
def emulator(
    argv: Callable[[int], list[str]], log: Path, env: Mapping[str, str] | None = None
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """(port, process) of `argv(port)` listening on a free port; terminated (killed after 10 s) after."""
    port = free_port()
    with open(log, "ab") as out:
        process = lifeline.popen(argv(port), stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_port(port, 60, process)
        yield port, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)  # reaped: a killed child never waited for fails a later test (ResourceWarning)

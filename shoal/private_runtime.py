"""`shoal serve`'s private runtime directory and the NATS identities in it (docs/security.md,
docs/design.md §9).

The directory is a scratch directory (`shared/process/scratch.py`): 0700, removed at stop, swept by
the next start after a crash. With an embedded nats-server it holds one new nkey per kind of
service (`nats/<kind>.nk`, 0600), which that server alone admits; every child is handed its own
file, and the directory, which the local data path keeps its sockets in.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from shared.process import credentials, scratch
from shared.process.credentials import Identities
from shared.process.settings import BusSettings, WorkerSettings
from shared.wire.permissions import INSTANCE, KINDS, OPERATOR

KIND = "shoal-run-"
S = TypeVar("S", bound=BusSettings)


@dataclass(frozen=True)
class Runtime:
    directory: Path
    identities: Identities | None  # None: an external NATS that admits anyone

    def authorization(self) -> str:
        """The nats-server `authorization` block admitting these identities ("" without them)."""
        return self.identities.authorization() if self.identities is not None else ""

    @property
    def operator(self) -> str:
        """The read-only identity's file (`shoal status`), or "" without identities."""
        return self.identities.file(OPERATOR) if self.identities is not None else ""


def make(embedded: bool, credentials_dir: str = "", kinds: tuple[str, ...] = ()) -> Runtime:
    """A new private directory; with `embedded`, new identities in it (and `kinds` beyond Shoal's
    own: the tests' `admin`); else those of `credentials_dir` (`shoal credentials --out`), if given."""
    directory = scratch.make(KIND)
    os.chmod(directory, 0o700)  # mkdtemp's mode already; said here because it is the point
    os.chmod(directory / scratch.OWNER, 0o600)
    identities = None
    if embedded:
        identities = credentials.make(directory / "nats", KINDS + kinds)
    elif credentials_dir:
        identities = credentials.load(Path(credentials_dir))
    return Runtime(directory, identities)


def remove(runtime: Runtime) -> None:
    shutil.rmtree(runtime.directory, ignore_errors=True)


def assign(service: str, settings: S, runtime: Runtime) -> S:
    """`settings` of a `service` ("gateway", "scheduler", "worker", "repository") with the runtime
    directory and that kind's identity, unless it names one of its own."""
    update: dict[str, str] = {"runtime_dir": str(runtime.directory)}
    if runtime.identities is not None and not settings.nats_credentials:
        update["nats_credentials"] = runtime.identities.file(service)
        if isinstance(settings, WorkerSettings):
            update["instance_credentials"] = runtime.identities.file(INSTANCE)
    return settings.model_copy(update=update)

"""`Triton()` without `nats_url`: the cluster `shoal serve` runs, started from this process.

PyTriton turns its `TritonConfig` into tritonserver's flags; so does this module, and hands
them to `shoal serve`'s own parser and supervisor, so the embedded cluster has exactly
`shoal serve`'s defaults (ports 8000/8001/8002, one worker, ...) and refuses a flag Shoal does
not support with `shoal serve`'s message. As in PyTriton, the repository is in explicit
model-control mode and (unless `model_repository` is given) an empty directory: the bound
models are loaded into it through the load API.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import weakref
from typing import Any

from shared.process import scratch
from shared.process.natsserver import NatsServer
from shared.wire.permissions import WORKER
from shoal import private_runtime
from shoal.cli import parse_serve, serve_parser
from shoal.ports import busy_endpoint, reserve_serving_ports
from shoal.pytriton.exceptions import PyTritonUnrecoverableError, PyTritonValidationError
from shoal.supervisor import Cluster, StartFailed, build_cluster

# TritonConfig fields that are not tritonserver flags
NOT_FLAGS = {"nats_url", "nats_credentials", "model_repository", "cache_directory"}


def serve_flags(config: Any) -> list[str]:
    """The tritonserver flags of the fields set in a `TritonConfig` (PyTriton passes only those)."""
    argv: list[str] = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value is None or field.name in NOT_FLAGS:
            continue
        flag = "--" + field.name.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            text = str(item).lower() if isinstance(item, bool) else str(item)
            argv.append(f"{flag}={text}")
    return argv


def _parse(argv: list[str]):
    _, unknown = serve_parser().parse_known_args(argv)
    if unknown:
        raise PyTritonValidationError(f"Shoal does not support these TritonConfig settings: {' '.join(unknown)}")
    try:
        return parse_serve(argv)
    except SystemExit as exc:
        raise PyTritonValidationError(str(exc.code)) from None


class EmbeddedCluster:
    def __init__(self, config: Any) -> None:
        self.workspace: pathlib.Path | None = None  # the model store, when the script names none
        repository = config.model_repository
        if repository is None:
            self.workspace = scratch.make("shoal-pytriton-")
            repository = str(self.workspace)
            # removed at stop, or when this object goes or the interpreter exits without a stop
            self._remove_workspace = weakref.finalize(self, shutil.rmtree, self.workspace, ignore_errors=True)
        self.args = _parse([*serve_flags(config), f"--model-repository={repository}", "--model-control-mode=explicit"])
        self.nats: NatsServer | None = None
        self.cluster: Cluster | None = None
        self.runtime: private_runtime.Runtime | None = None  # its identities, as `shoal serve`'s

    @property
    def worker_credentials(self) -> str:
        """The identity of the script's own worker (its bound functions)."""
        identities = self.runtime.identities if self.runtime is not None else None
        return identities.file(WORKER) if identities is not None else ""

    @property
    def http_port(self) -> int:
        return self.args.http_port

    def start(self) -> str:
        """Start nats-server and the services; returns the NATS URL once the gateway answers.

        A port in use fails at once with tritonserver's words, before anything starts: the
        readiness probe would otherwise reach whatever holds the port (another `shoal serve`)."""
        try:
            busy = busy_endpoint(self.args)
            if busy is not None:
                raise PyTritonUnrecoverableError(busy)
            reserve_serving_ports(self.args)  # nats-server must not take one before the gateway binds it
            self.runtime = private_runtime.make(embedded=True)
            authorization = self.runtime.authorization()  # stop() removes the server's store
            self.nats = NatsServer(monitor_port=self.args.nats_monitor_port, authorization=authorization)
            self.nats.start()
            self.cluster = build_cluster(self.args, self.nats.url, pathlib.Path(self.args.model_repository[0]))
            self.cluster.runtime = self.runtime
            self.cluster.fail_fast = True
            self.cluster.start()
            self.cluster.wait_ready(self.args.ready_timeout_secs)
        except StartFailed as exc:
            self.stop()
            raise PyTritonUnrecoverableError(str(exc)) from None
        except BaseException:
            self.stop()
            raise
        return self.nats.url

    def stop(self) -> None:
        try:
            if self.cluster is not None:
                self.cluster.stop(timeout=self.args.exit_timeout_secs)
        finally:
            if self.nats is not None:
                self.nats.stop()
            if self.workspace is not None:
                self._remove_workspace()
            if self.runtime is not None:
                private_runtime.remove(self.runtime)
            self.cluster = self.nats = self.runtime = None

"""Real services for tests: a nats-server on free ports and the Shoal services as processes."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnx import TensorProto

from services.repository import examples
from shared.process.natsserver import NatsCluster, NatsServer, free_port, wait_for_port
from shared.process.settings import GatewaySettings, RepositorySettings, SchedulerSettings, WorkerSettings
from shared.wire.permissions import ADMIN
from shoal import private_runtime
from shoal.supervisor import Cluster

DTYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BF16": TensorProto.BFLOAT16,
    "BYTES": TensorProto.STRING,
}


def identity_config(name: str, datatype: str, max_batch_size: int = 8, extra: str = "") -> str:
    config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    return (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "INPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n'
        f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{extra}"
    )


def build_test_repository(root: Path) -> Path:
    """The example models plus models that exercise datatypes, batching and failures."""
    examples.write_examples(root)
    for datatype, elem in DTYPES.items():
        name = f"identity_{datatype.lower()}"
        if datatype != "FP32":
            examples.write_model(root, name, examples.identity_graph(elem, 2, name), identity_config(name, datatype))
    # 8 requests within the 2 s delay fill the preferred batch of 8 and run as one execution
    examples.write_model(
        root,
        "batch_probe",
        examples.identity_graph(TensorProto.FLOAT, 2, "batch_probe"),
        identity_config("batch_probe", "FP32", 8, "dynamic_batching { max_queue_delay_microseconds: 2000000 }\n"),
    )
    # two instances, responses released in arrival order
    examples.write_model(
        root,
        "ordered",
        examples.identity_graph(TensorProto.FLOAT, 2, "ordered"),
        identity_config("ordered", "FP32", 8, "dynamic_batching { preserve_ordering: true }\n").replace(
            "count: 1", "count: 2"
        ),
    )
    # no config.pbtxt at all: auto-completed from the ONNX file
    examples.write_model(root, "autocomplete", examples.simple_graph(), None)
    # a config that does not parse: UNAVAILABLE with the parser's reason; the rest still loads
    examples.write_model(root, "broken_config", examples.simple_graph(), 'name: "broken_config"\nmax_batch_sze: 2\n')
    # parses, but the model file is not a valid ONNX graph for the config: the backend's reason
    bad = examples.write_model(root, "bad_io", examples.simple_graph(), identity_config("bad_io", "FP32"))
    (bad / "1" / "model.onnx").write_bytes(b"not an onnx file")
    # one BYTES element per request: what a raw binary request (no JSON) can carry
    examples.write_model(
        root,
        "identity_bytes_1",
        examples.identity_graph(TensorProto.STRING, 2, "identity_bytes_1"),
        identity_config("identity_bytes_1", "BYTES").replace("dims: [ -1 ]", "dims: [ 1 ]"),
    )
    # non-batching model (max_batch_size 0): full shapes in requests
    examples.write_model(
        root,
        "nobatch",
        examples.identity_graph(TensorProto.FLOAT, 2, "nobatch"),
        'name: "nobatch"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]\n',
    )
    return root


# The two shapes of a cluster (docs/design.md, "Co-hosting"): each gateway hosts a scheduler replica
# (`shoal serve`'s default), or standalone scheduler processes only. Tests run in the default
# shape unless they name one; the scheduling modules run in both (`shape` in tests/integration/conftest.py).
SHAPES = ("cohost", "standalone")
DEFAULT_SHAPE = os.environ.get("SHOAL_TEST_SHAPE", "cohost")
# how workers get the model files: read where the repository is, as `shoal serve` does ("path"), or
# fetched from NATS ("store", `shoal repository`'s default: tests/integration/test_model_files.py;
# SHOAL_TEST_MODEL_FILES=store runs any test that way)
DEFAULT_MODEL_FILES = os.environ.get("SHOAL_TEST_MODEL_FILES", "path")


@dataclass
class Running:
    nats: NatsServer  # with nats_nodes > 1: a NatsCluster (its `nodes` are NatsServers)
    cluster: Cluster

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.cluster.gateway.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.cluster.gateway.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.cluster.gateway.metrics_port}/metrics"

    def segments(self) -> int:
        """The shared-memory segments this run's services hold (their names carry its run id: other
        runs on the machine, other suites' too, make and free their own meanwhile)."""
        return len(glob.glob(f"/dev/shm/shoal_{self.cluster.run_id}_*"))


def scheduler_statuses(nats_url: str, wait: float = 0.2) -> dict[str, dict[str, Any]]:
    """Scheduler replica id -> its `status` (what `shoal status` reads: `owned`, `queues`, ...), for
    the replicas that answer with one."""
    from shoal.topology import collect

    return {
        s["metadata"]["instance"]: s["status"]
        for s in asyncio.run(collect(nats_url, wait=wait))
        if s["name"] == "shoal-scheduler" and "owned" in s["status"]
    }


@contextlib.contextmanager
def running_cluster(
    root: Path,
    workers: int = 1,
    transport: str = "auto",
    max_payload: int | None = None,
    supervise: bool = True,
    repository: dict | None = None,
    worker: dict | None = None,
    scheduler: dict | None = None,
    gateways: int = 1,
    schedulers: int = 1,
    workers_settings: list[dict] | None = None,
    nats_nodes: int = 1,
    nats_server: NatsServer | None = None,
    shape: str = "",
    nats_urls: dict[str, str] | None = None,
    ready_timeout_s: float = 90,
    **gateway: object,
) -> Iterator[Running]:
    """`nats_nodes` > 1: a NATS cluster of that many servers (routes, clustered JetStream);
    the services get every node's URL. `nats_server`: a started one the caller owns (and stops);
    `worker={"nats_url": ...}` then lets the workers reach it another way (tests/proxy.py).
    `shape` (default `DEFAULT_SHAPE`): "cohost", each gateway
    hosts a scheduler replica and `schedulers` - 1 standalone ones join it ("scheduler-1", ...);
    "standalone": `schedulers` scheduler processes ("scheduler", "scheduler-1", ...).
    `nats_urls`: a service kind ("gateway", "scheduler", "worker", "repository") -> the NATS URL it
    connects to instead of every node's (which node a service is on, in a NATS cluster)."""
    cohost = (shape or DEFAULT_SHAPE) == "cohost"
    scheduling = {"worker_timeout_s": 3, **(scheduler or {})}
    # authenticated as `shoal serve` is: each service with its kind's identity and permissions; the
    # test's own clients, which connect without credentials, are its `admin` (`authenticated`)
    runtime = private_runtime.make(embedded=nats_server is None)
    authorization = runtime.identities.authorization(anonymous=ADMIN) if runtime.identities is not None else ""
    nats: Any = nats_server or (
        NatsServer(max_payload=max_payload, authorization=authorization).start()
        if nats_nodes <= 1
        else NatsCluster(nats_nodes, max_payload=max_payload, authorization=authorization).start()
    )
    urls = nats_urls or {}

    def on(kind: str) -> dict[str, str]:
        return {"nats_url": urls.get(kind, nats.url)}

    def gateway_settings() -> GatewaySettings:
        return GatewaySettings(
            **{"request_timeout_s": 30, **gateway},
            **on("gateway"),
            http_address="127.0.0.1",
            http_port=free_port(),
            metrics_port=free_port(),
            grpc_address="127.0.0.1",
            grpc_port=free_port(),
            tensor_transport=transport,
            cohost_scheduler=cohost,
            **scheduling,
        )

    standalone = [SchedulerSettings(**on("scheduler"), **scheduling) for _ in range(schedulers)]
    cluster = Cluster(
        gateway_settings(),
        None if cohost else standalone[0],
        RepositorySettings(
            **on("repository"),
            model_repository=str(root),
            **{"worker_timeout_s": 3, "model_files": DEFAULT_MODEL_FILES, **(repository or {})},
        ),
        [
            # no drain at the stop, as `shoal serve`'s workers (its schedulers stop first: nothing sends
            # them batches then); a drain waited a quiet second at every cluster's end. The drain's own
            # tests ask for one (tests/integration/test_worker_drain.py)
            WorkerSettings(
                **{
                    **on("worker"),
                    "tensor_transport": transport,
                    "heartbeat_s": 0.5,
                    "drain_timeout_s": 0.0,
                    **(worker or {}),
                    **extra,
                }
            )
            for extra in (workers_settings or [{}] * workers)
        ],
        supervise=supervise,
        more_gateways=[gateway_settings() for _ in range(gateways - 1)],
        more_schedulers=standalone[1:],
        runtime=runtime,
    )
    try:
        cluster.start()
        cluster.wait_ready(ready_timeout_s)
        for more in cluster.more_gateways:  # wait_ready asks the first gateway only
            wait_for_port(more.http_port, 60)
        yield Running(nats, cluster)
    finally:
        cluster.stop(timeout=10)
        if nats_server is None:
            nats.stop()
        private_runtime.remove(runtime)

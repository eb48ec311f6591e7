"""`shoal serve`'s flags for the shape of the cluster it starts: how many of each process, where the
scheduler lives and how batches reach the workers (docs/design.md §7 and §9)."""

from __future__ import annotations

import argparse
import uuid
from typing import TypeVar

from shared.process import settings as s

# what only the first of several port-sharing gateways serves: the ports that are not shared
FIRST_GATEWAY_ONLY = {"allow_metrics": False, "openai_port": 0, "allow_vertex_ai": False, "allow_sagemaker": False}


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=1, help="worker processes to start (default: 1)")
    p.add_argument(
        "--model-files",
        choices=["path", "store"],
        default="path",
        help="path: the workers (all on this host) read the model files where the repository is; store: "
        "they are published into NATS too, for workers that join from other hosts (default: path)",
    )
    p.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="gateway processes sharing the HTTP and gRPC ports with SO_REUSEPORT (default: 1)",
    )
    p.add_argument(
        "--cohost-scheduler",
        type=s.parse_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="each gateway process hosts a scheduler replica, which takes the requests of the models it "
        "holds by a function call (default: true; false: standalone scheduler processes only)",
    )
    p.add_argument(
        "--local-channel",
        type=s.parse_bool,
        nargs="?",
        const=True,
        default=None,
        metavar="BOOL",
        help="batches and their answers between the gateways and the workers of this host go over Unix "
        "sockets instead of nats-server (docs/design.md §9) (default: true; false: over NATS)",
    )
    p.add_argument(
        "--schedulers",
        type=int,
        default=None,
        help="standalone scheduler processes (replicas): the models are shared out among them and the "
        "co-hosted ones, each model served by one at a time (default: 0 with --cohost-scheduler, else 1)",
    )


def check(args: argparse.Namespace) -> None:
    """Refuse a shape that cannot run, saying why; fill in the defaults that depend on another flag."""
    if args.workers < 1:
        raise SystemExit("shoal serve: --workers must be at least 1")
    if args.gateways < 1:
        raise SystemExit("shoal serve: --gateways must be at least 1")
    if args.schedulers is None:
        args.schedulers = 0 if args.cohost_scheduler else 1
    if args.schedulers < (0 if args.cohost_scheduler else 1):
        raise SystemExit(
            "shoal serve: --schedulers must be at least 1 with --cohost-scheduler=false"
            if not args.cohost_scheduler
            else "shoal serve: --schedulers must not be negative"
        )


Channeled = TypeVar("Channeled", s.GatewaySettings, s.WorkerSettings)


def with_local_channel(settings: Channeled, args: argparse.Namespace) -> Channeled:
    """`--local-channel` when given; else the settings' own default (SHOAL_<SERVICE>_LOCAL_CHANNEL)."""
    given: bool | None = getattr(args, "local_channel", None)
    return settings if given is None else settings.model_copy(update={"local_channel": given})


def port_sharing_gateways(gateway: s.GatewaySettings, count: int) -> tuple[s.GatewaySettings, list[s.GatewaySettings]]:
    """`count` gateways on one host, all on `gateway`'s HTTP and gRPC ports (SO_REUSEPORT: the kernel
    spreads new connections over them), for when one gateway's event loop is the bottleneck. The
    first serves the metrics (they come from the schedulers and workers over the bus, any gateway
    can answer them, and the port is not shared), the OpenAI-compatible API, Vertex AI's and SageMaker's."""
    if count <= 1:
        return gateway, []
    gateway = gateway.model_copy(update={"reuse_http_port": True, "reuse_grpc_port": True})
    more = [
        gateway.model_copy(update={"gateway_id": uuid.uuid4().hex[:12], **FIRST_GATEWAY_ONLY}) for _ in range(count - 1)
    ]
    return gateway, more

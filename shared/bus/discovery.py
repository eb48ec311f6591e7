"""Every service registers with NATS micro (`$SRV.PING/INFO/STATS`), with a live status endpoint.

`nats micro ls` and `shoal status` find the services this way; the `status` endpoint of each
instance answers what it is doing now (models, instances, queues).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import msgspec
from nats.aio.client import Client as NATS
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from shared.wire.status import Status

VERSION = "0.1.0"


def status_subject(service: str, instance_id: str) -> str:
    return f"shoal.topology.{service}.{instance_id}"


async def register(nc: NATS, service: str, instance_id: str, status: Callable[[], Status], **metadata: str) -> Service:
    svc = await add_service(
        nc,
        name=f"shoal-{service}",
        version=VERSION,
        description=f"Shoal {service}",
        metadata={"host": socket.gethostname(), "pid": str(os.getpid()), "instance": instance_id, **metadata},
    )

    async def handler(request: Request) -> None:
        await request.respond(msgspec.json.encode(status()))

    # a queue group of its own: every instance answers on its own subject
    await svc.add_endpoint(
        name="status",
        subject=status_subject(service, instance_id),
        handler=handler,
        queue_group=f"status-{instance_id}",
    )
    return svc

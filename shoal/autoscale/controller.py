"""`shoal autoscale`: scale a Docker deployment's workers from its queues (docs/scaling.md).

    shoal autoscale --swarm-service shoal_worker --nats-url tls://127.0.0.1:4222 \\
        --nats-credentials operator.nk --min 1 --max 8 --target-queue-ms 100

Every `--interval-s` it reads the signals (shoal/autoscale/signals.py), asks the policy
(shoal/autoscale/policy.py) for the desired count and, when it differs, scales the worker
service (shoal/autoscale/docker_backends.py). Each look is one JSON line on stdout (time,
signals, replicas, desired, reason): the record a deployment keeps of what it did and why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from shoal.autoscale import signals as signal_sources
from shoal.autoscale.docker_backends import Backend, ComposeService, SwarmService, client
from shoal.autoscale.policy import Policy, Signals, State, decide

log = logging.getLogger("shoal.autoscale")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shoal autoscale",
        description="Scale a Docker deployment's worker service from its queues (docs/scaling.md).",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--swarm-service", default="", help="the Swarm service of the workers (e.g. shoal_worker)")
    target.add_argument("--compose-project", default="", help="the Compose project whose workers to scale")
    p.add_argument("--service", default="worker", help="the Compose service of the workers (default: worker)")
    p.add_argument("--docker-host", default="", help="the Docker Engine (default: DOCKER_HOST, else its socket)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--nats-url", default="", help="read the signals from the services on this NATS")
    source.add_argument("--metrics-url", default="", help="read them from a gateway's /metrics (cannot wake from 0)")
    p.add_argument("--nats-credentials", default="", help="the operator identity to read NATS as (docs/security.md)")
    p.add_argument("--min", type=int, default=1, help="fewest workers; 0 scales to zero when idle (default: 1)")
    p.add_argument("--max", type=int, default=8, help="most workers (default: 8)")
    p.add_argument(
        "--target-queue-ms", type=float, default=100.0, help="the longest a request should wait (default: 100)"
    )
    p.add_argument("--target-pending", type=float, default=0.0, help="requests waiting per worker (default: 0, off)")
    p.add_argument(
        "--target-utilization",
        type=float,
        default=0.6,
        help="a worker fewer must keep its busy instances under this share (default: 0.6)",
    )
    p.add_argument("--up-cooldown-s", type=float, default=10.0, help="between two changes up (default: 10)")
    p.add_argument("--down-cooldown-s", type=float, default=60.0, help="slack held this long, then one fewer (60)")
    p.add_argument("--idle-window-s", type=float, default=300.0, help="--min 0: no request this long -> 0 (300)")
    p.add_argument("--interval-s", type=float, default=2.0, help="between two looks (default: 2)")
    p.add_argument("--dry-run", action="store_true", help="say what it would do, change nothing")
    return p


def policy_of(args: argparse.Namespace) -> Policy:
    return Policy(
        min_replicas=args.min,
        max_replicas=args.max,
        target_queue_s=args.target_queue_ms / 1000,
        target_pending=args.target_pending,
        target_utilization=args.target_utilization,
        scale_up_cooldown_s=args.up_cooldown_s,
        scale_down_cooldown_s=args.down_cooldown_s,
        idle_window_s=args.idle_window_s,
    )


async def run(
    policy: Policy,
    read: Callable[[], Awaitable[Signals]],
    backend: Backend,
    interval_s: float,
    dry_run: bool = False,
    stop: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    state = State()
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            signals = await read()
            replicas = await asyncio.to_thread(backend.replicas)
        except Exception as exc:  # the bus or the engine away for a moment: no decision on nothing
            log.warning("cannot read the signals or the replicas: %s", exc)
        else:
            decision = decide(policy, signals, replicas, clock(), state)
            state = decision.state
            line = {"time": time.time(), **asdict(signals), "replicas": replicas, "desired": decision.replicas}
            print(json.dumps({**line, "reason": decision.reason}), flush=True)
            if decision.replicas != replicas and not dry_run:
                log.info("%s: %d -> %d (%s)", backend.describe(), replicas, decision.replicas, decision.reason)
                try:
                    await asyncio.to_thread(backend.scale, decision.replicas)
                except Exception:
                    log.exception("scaling %s to %d failed", backend.describe(), decision.replicas)
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            pass


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    try:
        policy = policy_of(args)
    except ValueError as exc:
        raise SystemExit(f"shoal autoscale: {exc}") from None
    engine = client(args.docker_host)
    backend: Backend = (
        SwarmService(engine, args.swarm_service)
        if args.swarm_service
        else ComposeService(engine, args.compose_project, args.service)
    )
    if args.nats_url:
        url, credentials = args.nats_url, args.nats_credentials

        async def read() -> Signals:
            return await signal_sources.read_nats(url, credentials)

    else:
        metrics_url = args.metrics_url

        async def read() -> Signals:
            return await signal_sources.read_metrics(metrics_url)

    log.info("scaling %s between %d and %d workers", backend.describe(), policy.min_replicas, policy.max_replicas)
    try:
        asyncio.run(run(policy, read, backend, args.interval_s, args.dry_run))
    except KeyboardInterrupt:
        pass
    return 0

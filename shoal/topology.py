"""`shoal status`: the live topology, from the services' NATS micro registrations."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import msgspec
import nats

from shared.bus.connection import credential_options, refusal
from shared.process import cache_dirs, scratch
from shared.process.credentials import write_private
from shared.wire.status import KINDS, GatewayStatus, HostedStatus, RepositoryStatus, SchedulerStatus, WorkerStatus

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def record_serve(http_port: int, nats_url: str, repository: str, credentials: str = "") -> Path:
    """Written by `shoal serve` once its services run: where `shoal status --http-port` finds its NATS,
    and the read-only identity it reads it as (`credentials`: the operator's file, in the serve's
    private runtime directory; the record is its user's only, as that file is)."""
    path = cache_dirs.private_dir(cache_dirs.serve_records()) / f"{http_port}.json"  # its NATS: this user's
    record = {
        "http_port": http_port,
        "nats_url": nats_url,
        "pid": os.getpid(),
        "repository": repository,
        "credentials": credentials,
    }
    write_private(path, json.dumps(record).encode())
    return path


def forget_serve(path: Path) -> None:
    """Remove a serve's record unless a later `shoal serve` on the same port wrote it."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def recorded_serves() -> list[dict[str, Any]]:
    """The `shoal serve` processes alive on this machine (for this user's cache), newest first."""
    found = []
    for path in cache_dirs.serve_records().glob("*.json"):
        try:
            record = json.loads(path.read_text())
            started = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and scratch.running(int(record.get("pid", 0))):
            found.append((started, record))
        else:
            path.unlink(missing_ok=True)  # a serve that was killed leaves its record behind
    return [record for _, record in sorted(found, key=lambda pair: pair[0], reverse=True)]


def choose(nats_url: str | None, http_port: int | None, credentials: str = "") -> tuple[str, str, str]:
    """The NATS to read, a line naming it (and the other clusters on this machine, if any), and
    the identity to read it as: `credentials`, else the recorded `shoal serve`'s operator."""
    url, named = _choose(nats_url, http_port)
    if credentials:
        return url, named, credentials
    serve = next((r for r in recorded_serves() if r["nats_url"] == url), {})  # --nats-url of a serve here too
    return url, named, str(serve.get("credentials", ""))


def _choose(nats_url: str | None, http_port: int | None) -> tuple[str, str]:
    if nats_url:
        return nats_url, f"NATS {nats_url} (--nats-url)"
    serves = recorded_serves()
    ports = ", ".join(str(r["http_port"]) for r in serves) or "none"
    if http_port is not None:
        match = next((r for r in serves if r["http_port"] == http_port), None)
        if match is None:
            raise SystemExit(
                f"shoal status: no `shoal serve` with HTTP port {http_port} runs here (HTTP ports: {ports})"
            )
        return match["nats_url"], _named(match)
    if not serves:
        return DEFAULT_NATS_URL, f"NATS {DEFAULT_NATS_URL} (no `shoal serve` runs here; pick with --nats-url)"
    line = _named(serves[0])
    if len(serves) > 1:
        line += f"; other `shoal serve` here: HTTP port(s) {', '.join(str(r['http_port']) for r in serves[1:])}"
        line += " (pick with --http-port)"
    return serves[0]["nats_url"], line


def _named(record: dict[str, Any]) -> str:
    return f"NATS {record['nats_url']} (`shoal serve` pid {record['pid']}, HTTP port {record['http_port']})"


async def _gather(nc, subject: str, wait: float) -> list[dict[str, Any]]:
    inbox = nc.new_inbox()
    replies: list[dict[str, Any]] = []

    async def append(msg) -> None:
        try:
            replies.append(json.loads(msg.data))
        except ValueError:
            pass

    sub = await nc.subscribe(inbox, cb=append)
    await nc.publish(subject, b"", reply=inbox)
    await asyncio.sleep(wait)  # a scatter-gather has no count to wait for: a fixed window
    await sub.unsubscribe()
    return replies


async def collect(url: str, wait: float = 0.5, credentials: str = "") -> list[dict[str, Any]]:
    """Every Shoal service's NATS micro info, with what its `status` endpoint answers under `status`
    (checked against the service's status type: an answer that does not fit is an `error`)."""
    options: dict[str, Any] = credential_options(credentials)
    try:
        nc = await nats.connect(url, name="shoal-status", connect_timeout=2, max_reconnect_attempts=0, **options)
    except nats.errors.Error as exc:
        raise refusal(exc, url, credentials) or exc from None
    try:
        services = [s for s in await _gather(nc, "$SRV.INFO", wait) if s.get("name", "").startswith("shoal-")]
        for service in services:
            service["status"] = await _status(nc, service)
        return sorted(services, key=lambda s: (s["name"], s.get("metadata", {}).get("instance", "")))
    finally:
        await nc.close()


async def _status(nc: Any, service: dict[str, Any]) -> dict[str, Any]:
    endpoint = next((e for e in service.get("endpoints", []) if e.get("name") == "status"), None)
    kind = KINDS.get(service["name"].removeprefix("shoal-"))
    if endpoint is None or kind is None:
        return {}
    try:
        reply = await nc.request(endpoint["subject"], b"", timeout=2)
        answer: dict[str, Any] = msgspec.to_builtins(msgspec.json.decode(reply.data, type=kind))
        return answer
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}" if isinstance(exc, msgspec.DecodeError) else type(exc).__name__}


def describe(service: dict[str, Any]) -> str:
    kind = service["name"].removeprefix("shoal-")
    shown = service.get("status") or {}
    if not shown or "error" in shown or kind not in KINDS:  # no status endpoint, or no answer from it
        return json.dumps(shown)
    status = msgspec.convert(service["status"], KINDS[kind])
    if isinstance(status, GatewayStatus):
        return f"http {status.http}, {status.models} model(s), {status.requests_in_flight} request(s) in flight"
    if isinstance(status, SchedulerStatus):
        queues = ", ".join(
            f"{k}: {q.queued} queued/{q.running_batches} running/{q.free_credits} free"
            for k, q in status.queues.items()
        )
        return f"{len(status.workers)} worker(s); {queues or 'no queues'}"
    if isinstance(status, WorkerStatus):
        models = ", ".join(
            f"{k} x{m.instances} ({m.busy_instances} busy{_memory(m)})" for k, m in status.models.items()
        )
        return (models or "no models") + _budget(status) + _arrivals(status)
    if isinstance(status, RepositoryStatus):
        models = ", ".join(
            f"{name}/{v} {state}" for name, versions in status.models.items() for v, state in versions.items()
        )
        return f"{status.repository} ({status.mode}): {models or 'no models'}"
    return json.dumps(service["status"])


def _mib(value: int) -> str:
    return f"{value / (1 << 20):.1f} MiB"


def _memory(model: HostedStatus) -> str:
    """What a model's instances took at load (shared/memory/footprint.py)."""
    rss, device = model.rss_bytes, model.device_bytes
    return (f", {_mib(rss)}" if rss else "") + (f", GPU {_mib(device)}" if device else "")


def _budget(status: WorkerStatus) -> str:
    limits = []
    if status.budget_bytes:
        limits.append(f"budget {_mib(status.budget_bytes)}")
    if status.max_models:
        limits.append(f"at most {status.max_models} models")
    return f"; {', '.join(limits)}" if limits else ""


def _arrivals(status: WorkerStatus) -> str:
    """How many batches came over NATS and over the local channel (docs/design.md §9)."""
    if not status.local_channel:
        return f"; {status.batches_over_nats} batch(es) over NATS, local channel off"
    hot = f" ({status.batches_hot_loop} on its hot loop)" if status.batches_hot_loop else ""
    return f"; batches: {status.batches_over_nats} over NATS, {status.batches_over_channel} over the local channel{hot}"


def render(services: list[dict[str, Any]]) -> str:
    if not services:
        return "no Shoal service answered"
    rows = [
        (
            s["name"].removeprefix("shoal-"),
            s.get("metadata", {}).get("instance", s.get("id", "")),
            s.get("metadata", {}).get("host", ""),
            describe(s),
        )
        for s in services
    ]
    widths = [max(len(r[i]) for r in rows + [("SERVICE", "INSTANCE", "HOST", "")]) for i in range(3)]
    lines = [f"{'SERVICE':<{widths[0]}}  {'INSTANCE':<{widths[1]}}  {'HOST':<{widths[2]}}  STATUS"]
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}" for a, b, c, d in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """`shoal status [--nats-url URL [--nats-credentials FILE] | --http-port P] [--json]`."""
    parser = argparse.ArgumentParser(prog="shoal status", description="The live topology of a running Shoal.")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--nats-url", default=None, help="read the services on this NATS (default: see --http-port)")
    pick.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="read the `shoal serve` serving HTTP on this port (default: the latest `shoal serve` started here)",
    )
    parser.add_argument(
        "--nats-credentials",
        default="",
        help="read as this NATS identity (default: the `shoal serve`'s operator identity; docs/security.md)",
    )
    parser.add_argument("--json", action="store_true", help="the services as JSON on stdout (default: false)")
    args = parser.parse_args(argv)
    url, named, credentials = choose(args.nats_url, args.http_port, args.nats_credentials)
    try:
        services = asyncio.run(collect(url, credentials=credentials))
    except Exception as exc:
        raise SystemExit(f"shoal status: cannot reach NATS at {url}: {exc}") from None
    if args.json:
        print(named, file=sys.stderr)  # stdout stays JSON
        print(json.dumps(services, indent=2))
    else:
        print(named)
        print(render(services))

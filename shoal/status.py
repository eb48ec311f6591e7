"""`shoal status`: the live topology, from the services' NATS micro registrations."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

from shared.natsserver import default_cache_dir

SERVE_STATE = "serve.json"  # written by `shoal serve`: where its embedded NATS listens


def serve_state_path() -> Path:
    return default_cache_dir() / SERVE_STATE


def default_nats_url() -> str:
    try:
        return json.loads(serve_state_path().read_text())["nats_url"]
    except (OSError, ValueError, KeyError):
        return "nats://127.0.0.1:4222"


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


async def collect(url: str, wait: float = 0.5) -> list[dict[str, Any]]:
    nc = await nats.connect(url, name="shoal-status", connect_timeout=2, max_reconnect_attempts=0)
    try:
        services = [s for s in await _gather(nc, "$SRV.INFO", wait) if s.get("name", "").startswith("shoal-")]
        for service in services:
            endpoint = next((e for e in service.get("endpoints", []) if e.get("name") == "status"), None)
            service["status"] = {}
            if endpoint:
                try:
                    reply = await nc.request(endpoint["subject"], b"", timeout=2)
                    service["status"] = json.loads(reply.data)
                except Exception as exc:
                    service["status"] = {"error": type(exc).__name__}
        return sorted(services, key=lambda s: (s["name"], s.get("metadata", {}).get("instance", "")))
    finally:
        await nc.close()


def describe(service: dict[str, Any]) -> str:
    status, meta = service.get("status", {}), service.get("metadata", {})
    kind = service["name"].removeprefix("shoal-")
    if kind == "gateway":
        return (
            f"http {status.get('http')}, {status.get('models')} model(s), "
            f"{status.get('requests_in_flight')} request(s) in flight"
        )
    if kind == "scheduler":
        queues = ", ".join(
            f"{k}: {q['queued']} queued/{q['running_batches']} running/{q['free_credits']} free"
            for k, q in status.get("queues", {}).items()
        )
        return f"{len(status.get('workers', []))} worker(s); {queues or 'no queues'}"
    if kind == "worker":
        models = ", ".join(
            f"{k} x{m['instances']} ({m['busy_instances']} busy)" for k, m in status.get("models", {}).items()
        )
        return models or "no models"
    if kind == "repository":
        models = ", ".join(
            f"{name}/{v} {state}"
            for name, versions in status.get("models", {}).items()
            for v, state in versions.items()
        )
        return f"{meta.get('repository')} ({meta.get('mode')}): {models or 'no models'}"
    return json.dumps(status)


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

"""`shoal serve`'s bus admits only its own services, each to its own job (issue 44; docs/security.md).

One `shoal serve` (model files in the object store, so that both of the repository's stores exist),
probed with each identity it made: every denial is nats-server's own answer, naming the subject."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from shared.bus import connection
from shared.wire import subjects
from tests.serving import command_of, descendants, wait_until
from tests.shoal.serving import Serve, one_model_repository, serve, status_env

pytestmark = pytest.mark.timeout(300)


class Identity:
    """A client of the serve's NATS as one identity, recording what nats-server refuses it."""

    def __init__(self, url: str, credentials: str) -> None:
        self.url, self.credentials = url, credentials
        self.refused: list[str] = []
        self.nc: NATS | None = None

    async def __aenter__(self) -> Identity:
        async def error_cb(exc: Exception) -> None:
            self.refused.append(str(exc).lower())  # nats-py lowercases the server's text

        self.nc = await nats.connect(
            self.url, nkeys_seed=self.credentials, error_cb=error_cb, allow_reconnect=False, connect_timeout=5
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.nc is not None
        await self.nc.close()

    async def denied(self, what: str, subject: str, timeout: float = 20.0) -> None:
        """nats-server refused this identity `what` ("publish" or "subscription") to `subject` (or,
        for a `subject` ending in ".", to a subject it begins)."""
        expected = f'permissions violation for {what} to "{subject.lower()}' + ("" if subject.endswith(".") else '"')
        deadline = time.monotonic() + timeout
        while not any(expected in error for error in self.refused):
            assert time.monotonic() < deadline, f"not refused {what} to {subject}: {self.refused}"
            await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, dict, Path]]:
    root = tmp_path_factory.mktemp("security")
    cache = root / "cache"
    with serve(one_model_repository(root / "models", "alpha"), cache, "--model-files=store") as running:
        running.wait_for("| alpha ")
        record = json.loads((cache / "shoal" / "serve" / f"{running.http_port}.json").read_text())
        yield running, record, Path(record["credentials"]).parent


def run(coroutine):  # each test's own loop: the identities connect and close in it
    return asyncio.run(coroutine)


def test_the_identities_are_private_files_in_a_private_directory(served):
    running, record, identities = served
    runtime = identities.parent
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert stat.S_IMODE(identities.stat().st_mode) == 0o700
    for kind in ("gateway", "scheduler", "worker", "instance", "repository", "operator"):
        assert stat.S_IMODE((identities / f"{kind}.nk").stat().st_mode) == 0o600
    # every child was handed its own kind's file and the directory
    children = [command_of(pid) for pid in descendants(running.process.pid)]
    for kind in ("gateway", "worker", "repository"):
        line = next(a for a in children if f"shoal.cli {kind}" in a)
        assert f"--nats-credentials {identities / kind}.nk" in line and f"--runtime-dir {runtime}" in line


def test_a_client_without_credentials_is_refused_at_once(served):
    _, record, _ = served

    # on the wire: the server asks for authentication, and a client that has none is turned away
    host, port = record["nats_url"].removeprefix("nats://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock, sock.makefile("rb") as reader:
        info = json.loads(reader.readline().removeprefix(b"INFO "))
        assert info["auth_required"] is True and info.get("nonce")  # the nonce an nkey signs
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        assert reader.readline().strip() == b"-ERR 'Authorization Violation'"

    async def probe() -> None:
        started = time.monotonic()
        with pytest.raises(connection.BusRefused, match="--nats-credentials"):
            await connection.connect(record["nats_url"], "test-no-credentials")
        assert time.monotonic() - started < 10  # no retry loop

    run(probe())


def test_a_service_without_credentials_exits_at_once_naming_the_flag(served):
    _, record, _ = served
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "shoal.cli", "worker", "--nats-url", record["nats_url"]],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.endswith("NATS_CREDENTIALS")},
    )
    assert done.returncode != 0
    assert "demands credentials" in done.stderr and "--nats-credentials" in done.stderr, done.stderr
    assert time.monotonic() - started < 60, "refused once, not retried"


def test_a_gateway_cannot_write_model_state_or_files(served):
    _, record, identities = served

    async def probe() -> None:
        async with Identity(record["nats_url"], str(identities / "gateway.nk")) as gateway:
            assert gateway.nc is not None
            js = gateway.nc.jetstream(timeout=2)
            models = await js.key_value(subjects.MODELS_BUCKET)
            before = await models.get(subjects.model_key("alpha"))  # it reads them
            with pytest.raises(nats.errors.TimeoutError):  # the put is dropped: no acknowledgement
                await models.put(subjects.model_key("alpha"), b"swapped")
            await gateway.denied("publish", f"$KV.{subjects.MODELS_BUCKET}.{subjects.model_key('alpha')}")
            assert (await models.get(subjects.model_key("alpha"))).value == before.value
            files = await js.object_store(subjects.MODEL_FILES_BUCKET)
            with pytest.raises(nats.errors.TimeoutError):
                await files.put("sha256-" + "0" * 64, b"not the model")
            await gateway.denied("publish", f"$O.{subjects.MODEL_FILES_BUCKET}.C.")  # its chunk subject's prefix
            for stream in (f"KV_{subjects.MODELS_BUCKET}", f"OBJ_{subjects.MODEL_FILES_BUCKET}"):
                await gateway.nc.publish(f"$JS.API.STREAM.PURGE.{stream}", b"")
                await gateway.denied("publish", f"$JS.API.STREAM.PURGE.{stream}")
            await gateway.nc.publish(subjects.worker_report("any"), b"")
            await gateway.denied("publish", subjects.worker_report("any"))

    run(probe())


def test_a_worker_cannot_speak_for_the_repository(served):
    _, record, identities = served

    async def probe() -> None:
        async with Identity(record["nats_url"], str(identities / "worker.nk")) as worker:
            assert worker.nc is not None
            for subject in (subjects.worker_report("w"), subjects.SCHEDULER_DRAIN, subjects.SCHEDULER_USAGE):
                await worker.nc.publish(subject, b"")
                await worker.denied("publish", subject)
            await worker.nc.subscribe(subjects.REPOSITORY_LOAD)  # answering loads in its place
            await worker.denied("subscription", subjects.REPOSITORY_LOAD)
            await worker.nc.subscribe(subjects.infer("alpha"))  # taking requests meant for a scheduler
            await worker.denied("subscription", subjects.infer("alpha"))
            await worker.nc.publish(f"$KV.{subjects.MODELS_BUCKET}.alpha", b"")
            await worker.denied("publish", f"$KV.{subjects.MODELS_BUCKET}.alpha")

    run(probe())


def test_the_operator_reads_and_writes_nothing(served):
    running, record, identities = served
    out = subprocess.run(
        [sys.executable, "-m", "shoal.cli", "status", f"--http-port={running.http_port}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=status_env(running.log.parent / "cache"),  # it finds the serve's record there, and the identity
    )
    assert out.returncode == 0, out.stderr
    assert "alpha/1 READY" in out.stdout

    async def probe() -> None:
        async with Identity(record["nats_url"], record["credentials"]) as operator:
            assert operator.nc is not None
            models = await operator.nc.jetstream(timeout=5).key_value(subjects.MODELS_BUCKET)
            assert (await models.get(subjects.model_key("alpha"))).value  # it reads
            for subject in (subjects.infer("alpha"), f"$KV.{subjects.MODELS_BUCKET}.alpha", subjects.LOGGING):
                await operator.nc.publish(subject, b"")
                await operator.denied("publish", subject)
            await operator.nc.subscribe("shoal.gw.>")  # the answers' tensors
            await operator.denied("subscription", "shoal.gw.>")

    run(probe())


def test_the_runtime_directory_is_gone_after_stop(tmp_path):
    cache = tmp_path / "cache"
    with serve(one_model_repository(tmp_path / "models", "beta"), cache) as running:
        running.wait_for("| beta ")
        record = json.loads((cache / "shoal" / "serve" / f"{running.http_port}.json").read_text())
        runtime = Path(record["credentials"]).parents[1]
        assert runtime.is_dir()
    wait_until(lambda: not runtime.exists(), 30, "the runtime directory removed")

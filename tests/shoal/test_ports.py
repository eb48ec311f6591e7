"""`shoal serve` refuses to start when one of its ports is taken, as tritonserver does, instead of
restarting a gateway that cannot bind until the ready timeout."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from shared.process.natsserver import free_port
from shoal.ports import busy_endpoint


@contextmanager
def listening() -> Iterator[int]:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "http_address": "0.0.0.0",
        "http_port": free_port(),
        "allow_http": None,  # not given: on
        "reuse_http_port": False,
        "allow_grpc": True,
        "reuse_grpc_port": False,
        "grpc_address": "0.0.0.0",
        "grpc_port": free_port(),
        "allow_metrics": True,
        "metrics_address": "",
        "metrics_port": free_port(),
        "openai_address": "",
        "openai_port": 0,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_free_ports_are_not_reported() -> None:
    assert busy_endpoint(_args()) is None


def test_each_taken_port_is_named_with_tritons_words() -> None:
    with listening() as port:
        assert busy_endpoint(_args(http_port=port)) == (
            f"failed to start HTTP service: Unavailable - Socket '0.0.0.0:{port}' already in use"
        )
        assert busy_endpoint(_args(grpc_port=port)) == (
            f"failed to start GRPC service: Unavailable - Socket '0.0.0.0:{port}' already in use"
        )
        assert busy_endpoint(_args(metrics_port=port)) == (
            f"failed to start Metrics service: Unavailable - Socket '0.0.0.0:{port}' already in use"
        )
        assert busy_endpoint(_args(openai_port=port)) == (
            f"failed to start OpenAI service: Unavailable - Socket '0.0.0.0:{port}' already in use"
        )


def test_ports_of_endpoints_that_are_off_or_shared_are_not_checked() -> None:
    with listening() as port:
        assert busy_endpoint(_args(grpc_port=port, allow_grpc=False)) is None
        assert busy_endpoint(_args(grpc_port=port, reuse_grpc_port=True)) is None
        assert busy_endpoint(_args(http_port=port, reuse_http_port=True)) is None
        assert busy_endpoint(_args(http_port=port, allow_http=False)) is None
        assert busy_endpoint(_args(metrics_port=port, allow_metrics=False)) is None


def test_serve_exits_at_once_when_its_grpc_port_is_taken() -> None:
    with listening() as port:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "shoal.cli",
                "serve",
                f"--grpc-port={port}",
                f"--http-port={free_port()}",
                f"--metrics-port={free_port()}",
            ],
            capture_output=True,
            text=True,
            timeout=60,  # the ready timeout would be minutes: failing fast is the behaviour under test
        )
    assert done.returncode == 1
    assert f"failed to start GRPC service: Unavailable - Socket '0.0.0.0:{port}' already in use" in done.stderr

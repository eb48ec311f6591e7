"""A real S3-compatible server for the tests: moto's server mode (the `moto[server]` package) as a
process of its own on a free port, reached over HTTP by boto3, s3fs and the repository service
alike, with the usual AWS environment variables. Never a mocked client."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.emulators import emulator

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "shoal-test",
    "AWS_SECRET_ACCESS_KEY": "shoal-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, bucket: str, prefix: str) -> str:
        """A repository URL in Triton's form for an S3 endpoint of its own: s3://host:port/bucket/path."""
        return f"s3://127.0.0.1:{self.port}/{bucket}/{prefix}"

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_lowercase(CREDENTIALS))

    def upload_tree(self, bucket: str, prefix: str, root: Path) -> None:
        client = self.client()
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def _lowercase(env: dict[str, str]) -> dict[str, str]:
    names = {"AWS_ACCESS_KEY_ID": "aws_access_key_id", "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key"}
    return {names[k]: v for k, v in env.items() if k in names} | {"region_name": env["AWS_DEFAULT_REGION"]}


@contextlib.contextmanager
def running_s3(log: Path) -> Iterator[S3Server]:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the S3 tests need s3fs and moto[server] (pip install -e '.[test]'): {exc}")

    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    with emulator(argv, log, {**os.environ, **CREDENTIALS}) as (port, process):
        yield S3Server(port, process)

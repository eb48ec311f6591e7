"""A real Google Cloud Storage server for the tests: PyPI's gcp-storage-emulator (the GCS JSON API,
in memory) as a process of its own on a free port, reached over HTTP by gcsfs and the repository
service alike through STORAGE_EMULATOR_HOST, the Google client libraries' variable for an
emulator. Never a mocked client."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.emulators import emulator


@dataclass
class GcsServer:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, bucket: str, prefix: str) -> str:
        """A repository URL in Triton's form: gs://bucket/path."""
        return f"gs://{bucket}/{prefix}"

    def client(self) -> Any:
        from gcsfs.core import GCSFileSystem  # the JSON API's, as the repository service's (remote.py)

        # a fresh instance each time: fsspec's cache would hand back one that listed the bucket before
        return GCSFileSystem(endpoint_url=self.endpoint, token="anon", skip_instance_cache=True)

    def create_bucket(self, bucket: str) -> None:
        self.client().mkdir(bucket)

    def put(self, bucket: str, name: str, body: bytes) -> None:
        self.client().pipe_file(f"{bucket}/{name}", body)

    def delete(self, bucket: str, name: str) -> None:
        self.client().rm_file(f"{bucket}/{name}")

    def upload_tree(self, bucket: str, prefix: str, root: Path) -> None:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            self.put(bucket, f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())


@contextlib.contextmanager
def running_gcs(log: Path) -> Iterator[GcsServer]:
    try:
        import gcsfs  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the GCS tests need gcsfs and gcp-storage-emulator (pip install -e '.[test]'): {exc}")
    command = shutil.which("gcp-storage-emulator", path=os.path.dirname(sys.executable))
    if command is None:
        pytest.skip("the GCS tests need gcp-storage-emulator (pip install -e '.[test]')")

    def argv(port: int) -> list[str]:
        return [command, "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"]

    with emulator(argv, log) as (port, process):
        yield GcsServer(port, process)

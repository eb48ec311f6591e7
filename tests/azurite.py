"""A real Azure Blob Storage server for the tests: Azurite (Azure's own storage emulator, npm's
`azurite`), its blob service alone as a process of its own on a free port with a temporary
location, reached over HTTP by azure-storage-blob, adlfs and the repository service alike. Never a
mocked client.

Azurite lives in a cache folder (`AZURITE_DIR`), installed there with npm: by .ci/run, or here the
first time a test needs it. Without node/npm, or when the install fails, the tests skip and say why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.emulators import emulator

AZURITE_DIR = Path(os.environ.get("SHOAL_AZURITE_DIR", Path.home() / ".cache" / "shoal-tests" / "azurite"))
AZURITE_VERSION = "3"  # npm's major version: 3.x serves the API versions azure-storage-blob 12 speaks
# Azurite's one built-in account and its published key (Azure's docs for the emulator)
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_blob() -> Path:
    """Azurite's blob-service command, installed into AZURITE_DIR with npm if it is not there yet."""
    command = AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"
    if command.exists():
        return command
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("the Azure tests need Azurite, from npm: node and npm are not installed (.ci/run installs them)")
    AZURITE_DIR.mkdir(parents=True, exist_ok=True)
    with open(AZURITE_DIR / ".install-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time; the others find it done
        if not command.exists():
            install = [npm, "install", "--prefix", str(AZURITE_DIR), "--no-audit", "--no-fund"]
            try:  # within a test's time (about 45 s on an idle machine); .ci/run installs it with no limit
                done = subprocess.run(
                    [*install, f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, timeout=90
                )
            except subprocess.TimeoutExpired:
                pytest.skip(f"the Azure tests need Azurite: `npm install azurite` took over 90 s (into {AZURITE_DIR})")
            if done.returncode != 0 or not command.exists():
                pytest.skip(f"the Azure tests need Azurite: `npm install azurite` failed: {done.stderr[-600:]}")
    return command


@dataclass
class AzuriteServer:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def connection_string(self, key: str = KEY) -> str:
        """Azure's own form for an endpoint of one's own (AZURE_STORAGE_CONNECTION_STRING)."""
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};BlobEndpoint={self.endpoint};"

    def url(self, container: str, prefix: str) -> str:
        """A repository URL in Triton's form: as://account/container/path."""
        return f"as://{ACCOUNT}/{container}/{prefix}"

    def client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string())

    def put(self, container: str, name: str, body: bytes) -> None:
        with self.client() as client:
            client.get_blob_client(container, name).upload_blob(body, overwrite=True)

    def delete(self, container: str, name: str) -> None:
        with self.client() as client:
            client.get_blob_client(container, name).delete_blob()

    def upload_tree(self, container: str, prefix: str, root: Path) -> None:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            self.put(container, f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())


@contextlib.contextmanager
def running_azurite(location: Path) -> Iterator[AzuriteServer]:
    try:
        import adlfs  # noqa: F401
        import azure.storage.blob  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the Azure tests need adlfs (pip install -e '.[test]'): {exc}")
    command = azurite_blob()
    location.mkdir(parents=True, exist_ok=True)

    def argv(port: int) -> list[str]:
        return [
            str(command),
            "--blobHost=127.0.0.1",
            f"--blobPort={port}",
            f"--location={location}",
            "--skipApiVersionCheck",  # the Python SDK may be newer than this Azurite
            "--silent",
        ]

    with emulator(argv, location / "azurite.log") as (port, process):
        yield AzuriteServer(port, process)

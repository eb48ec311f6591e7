"""One bucket named `models` on a real server of each cloud the repository reads: S3 (moto,
tests/s3.py), Google Cloud Storage (gcp-storage-emulator, tests/gcs.py) and Azure Blob Storage
(Azurite, tests/azurite.py), with the environment that points the services at it, so that a test
runs the same steps against all three."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.azurite import running_azurite
from tests.gcs import running_gcs
from tests.s3 import CREDENTIALS, running_s3

KINDS = ["s3", "gs", "as"]
BUCKET = "models"


@dataclass
class Bucket:
    kind: str
    url: Callable[[str], str]  # the repository URL of a prefix, in Triton's form
    put: Callable[[str, bytes], None]  # object name, body
    delete: Callable[[str], None]

    def upload_tree(self, prefix: str, root: Path) -> None:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            self.put(f"{prefix}/{path.relative_to(root).as_posix()}", path.read_bytes())


@contextlib.contextmanager
def running_bucket(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bucket]:
    """The services started after this inherit the environment it sets (the providers' variables)."""
    for name in ("TRITON_CLOUD_CREDENTIAL_PATH", "AZURE_STORAGE_AUTH_TYPE", "AZURE_STORAGE_KEY"):
        monkeypatch.delenv(name, raising=False)
    if kind == "s3":
        for name, value in CREDENTIALS.items():
            monkeypatch.setenv(name, value)
        with running_s3(tmp_path / "moto.log") as s3:
            client = s3.client()
            client.create_bucket(Bucket=BUCKET)
            yield Bucket(
                kind,
                lambda prefix: s3.url(BUCKET, prefix),
                lambda name, body: client.put_object(Bucket=BUCKET, Key=name, Body=body),
                lambda name: client.delete_object(Bucket=BUCKET, Key=name),
            )
    elif kind == "gs":
        with running_gcs(tmp_path / "gcs.log") as gcs:
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
            gcs.create_bucket(BUCKET)
            yield Bucket(
                kind,
                lambda prefix: gcs.url(BUCKET, prefix),
                lambda name, body: gcs.put(BUCKET, name, body),
                lambda name: gcs.delete(BUCKET, name),
            )
    else:
        with running_azurite(tmp_path / "azurite") as azurite:
            monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string())
            with azurite.client() as client:
                client.create_container(BUCKET)
            yield Bucket(
                kind,
                lambda prefix: azurite.url(BUCKET, prefix),
                lambda name, body: azurite.put(BUCKET, name, body),
                lambda name: azurite.delete(BUCKET, name),
            )

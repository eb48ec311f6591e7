"""A model repository in a cloud bucket, as Triton takes one: `--model-repository=s3://bucket/path`
(`s3://host:port/bucket/path` or `s3://https://host:port/bucket/path` for another S3 endpoint),
`gs://bucket/path`, `as://account/container/path`.

Only the repository service reads it, through fsspec (s3fs, gcsfs, adlfs: the `s3`, `gcs` and
`azure` extras, `cloud` for all three), with the credentials Triton's core would use for it: from
the environment or the TRITON_CLOUD_CREDENTIAL_PATH file, Azure managed identity included
(cloud_credentials.py). It keeps a mirror of the bucket's prefix on its own disk and works on
that like on a local directory: scans, configs, labels, polling, and the files it publishes into
NATS for the workers (publishing.py).

`sync()` brings the mirror up to date: a file whose size and ETag (or modification time) changed
is downloaded again, whole, under a temporary name then renamed; one gone from the bucket goes
from the mirror. It runs at start (everything), before each poll round (everything) and before a
model's load (that model): a load, a reload after a change in the bucket and an on-demand load
all see the bucket as it is then.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.repository import cloud_credentials
from shared.process import cache_dirs

log = logging.getLogger("shoal.repository")

# scheme -> (fsspec protocol, the extra that brings its implementation)
SCHEMES = {"s3": ("s3", "s3"), "gs": ("gcs", "gcs"), "gcs": ("gcs", "gcs"), "as": ("abfs", "azure")}
STATE = ".shoal-mirror.json"  # in the mirror: path -> what the bucket said of it when it was fetched


class RemoteError(Exception):
    """The bucket cannot be read (no library for it, no credentials, no such bucket)."""


def is_remote(repository: str) -> bool:
    return urlsplit(repository).scheme in SCHEMES


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, the repository's prefix in it: `bucket/path`) for a repository URL, with
    the credentials Triton would use for it (cloud_credentials.py)."""
    scheme, rest = url.split("://", 1)
    protocol, extra = SCHEMES[scheme]
    try:
        import fsspec

        if protocol == "s3":
            return _s3(fsspec, url, rest)
        if protocol == "abfs":  # as://account/container/path
            return _azure(fsspec, url), rest.partition("/")[2].strip("/")
        return _gcs(url), rest.strip("/")
    except ImportError as exc:
        raise RemoteError(
            f"a {scheme}:// model repository needs the '{extra}' extra: pip install 'shoal[{extra}]' ({exc})"
        ) from None
    except cloud_credentials.CredentialError as exc:
        raise RemoteError(str(exc)) from None


def _s3(fsspec: Any, url: str, rest: str) -> tuple[Any, str]:
    endpoint = ""
    if rest.startswith(("http://", "https://")):  # s3://https://host:port/bucket/path
        web, _, rest = rest.partition("://")
        host, _, rest = rest.partition("/")
        endpoint = f"{web}://{host}"
    elif ":" in rest.split("/", 1)[0]:  # s3://host:port/bucket/path (Triton's form)
        host, _, rest = rest.partition("/")
        endpoint = f"http://{host}"
    auth = cloud_credentials.s3_auth(url)
    client = {"endpoint_url": endpoint, "region_name": auth.region}
    given = {"key": auth.key_id, "secret": auth.secret_key, "token": auth.session_token, "profile": auth.profile}
    options: dict[str, Any] = {name: value for name, value in given.items() if value}  # else s3fs's own chain
    if any(client.values()):
        options["client_kwargs"] = {name: value for name, value in client.items() if value}
    return fsspec.filesystem("s3", **options), rest.strip("/")


def _gcs(url: str) -> Any:
    """gcsfs's JSON-API filesystem, as Triton reads GCS (over REST), not the experimental one that
    fsspec's "gcs" now names (it asks the gRPC control plane for each bucket's layout first)."""
    from gcsfs.core import GCSFileSystem

    auth = cloud_credentials.gcs_auth(url)
    token = auth.credentials_path or ("anon" if auth.endpoint else None)
    return GCSFileSystem(token=token, endpoint_url=auth.endpoint or None)


def _azure(fsspec: Any, url: str) -> Any:
    """adlfs with Triton's choice: managed identity, azure-identity's default chain, a shared key,
    or anonymous; a connection string (an endpoint of one's own) as given."""
    auth = cloud_credentials.azure_auth(url)
    # azure-core logs every request and response at INFO: the repository's log is for its own news
    logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)
    if auth.kind == "connection_string":
        return fsspec.filesystem("abfs", connection_string=auth.connection_string)
    if auth.kind == "key":
        return fsspec.filesystem("abfs", account_name=auth.account, account_key=auth.key)
    if auth.kind == "anonymous":
        return fsspec.filesystem("abfs", account_name=auth.account, anon=True)
    return fsspec.filesystem("abfs", account_name=auth.account, credential=azure_credential(auth), anon=False)


def azure_credential(auth: cloud_credentials.AzureAuth) -> Any:
    """The token credential of a managed identity (user-assigned with its client id) or of the
    DefaultAzureCredential chain: azure-identity's, in its asyncio form (adlfs's)."""
    from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

    if auth.kind == "managed_identity":
        return ManagedIdentityCredential(client_id=auth.client_id or None)
    return DefaultAzureCredential()


def _stamp(info: dict[str, Any]) -> str:
    """What says a file changed: its ETag (S3, Azure), else its generation or modification time."""
    for key in ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "updated", "mtime"):
        if info.get(key):
            return f"{key}:{info[key]}"
    return ""


class RemoteRepository:
    def __init__(self, url: str, mirrors: Path) -> None:
        self.url = url
        self.fs, self.prefix = filesystem(url)
        # the repository's models, code included: this user's only (docs/security.md)
        self.mirror = cache_dirs.private_dir(mirrors) / hashlib.sha256(url.encode()).hexdigest()[:16]
        self.mirror.mkdir(mode=0o700, exist_ok=True)
        self._lock = threading.Lock()  # syncs run on threads: one at a time

    def sync(self, model: str | None = None) -> int:
        """Bring the mirror (or one model's part of it) up to date; the files changed. Blocking."""
        with self._lock:
            return self._sync(model)

    def _sync(self, model: str | None) -> int:
        base = f"{self.prefix}/{model}" if model else self.prefix
        try:
            self.fs.invalidate_cache()
            there = self.fs.exists(base)
            found = self.fs.find(base, detail=True) if there else {}
        except Exception as exc:
            raise RemoteError(f"cannot list {self.url}{'/' + model if model else ''}: {exc}") from exc
        if not there and model is None:  # a model may be gone from the bucket; the repository may not
            raise RemoteError(f"cannot list {self.url}: no such bucket or path")
        remote: dict[str, tuple[int, str]] = {}
        for name, info in found.items():
            if info.get("type") == "directory" or not name.startswith(self.prefix + "/"):
                continue
            relative = name[len(self.prefix) + 1 :]
            if relative.startswith("/") or ".." in relative.split("/"):
                continue  # never outside the mirror
            remote[relative] = (int(info.get("size") or 0), _stamp(info))
        state = self._state()
        scope = f"{model}/" if model else ""
        changed = 0
        for relative, stamp in sorted(remote.items()):
            local = self.mirror / relative
            if state.get(relative) == list(stamp) and local.is_file():
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            partial = local.with_name(f".{local.name}.partial")
            try:
                self.fs.get_file(f"{self.prefix}/{relative}", str(partial))
            except Exception as exc:
                partial.unlink(missing_ok=True)
                raise RemoteError(f"cannot fetch {self.url}/{relative}: {exc}") from exc
            os.replace(partial, local)
            state[relative] = list(stamp)
            changed += 1
        for relative in [r for r in state if r.startswith(scope) and r not in remote]:
            (self.mirror / relative).unlink(missing_ok=True)
            del state[relative]
            changed += 1
        self._prune(self.mirror / model if model else self.mirror)
        (self.mirror / STATE).write_text(json.dumps(state))
        if changed:
            log.info(
                "%s: %d file(s) changed in the mirror %s",
                self.url + (f"/{model}" if model else ""),
                changed,
                self.mirror,
            )
        return changed

    def _state(self) -> dict[str, list[Any]]:
        try:
            loaded: dict[str, list[Any]] = json.loads((self.mirror / STATE).read_text())
            return loaded
        except (OSError, ValueError):
            return {}

    def _prune(self, top: Path) -> None:
        """Directories left empty (a model or version gone from the bucket) go too."""
        if not top.is_dir():
            return
        for root, _, _ in os.walk(top, topdown=False):
            path = Path(root)
            if path != self.mirror and not any(path.iterdir()):
                path.rmdir()

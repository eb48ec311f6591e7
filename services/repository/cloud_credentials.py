"""Which credentials a cloud model repository is read with, chosen as Triton's core chooses them
(core `src/filesystem/api.cc` `LoadCredentials`, `implementations/{s3,gcs,as}.h`).

With `TRITON_CLOUD_CREDENTIAL_PATH` set, from that JSON file alone: per scheme (`s3`, `gs`, `as`) a
name -> credential map, the longest name that starts the repository's URL wins (`""` matches
every URL), none: `Cannot match credential for path  <url>`. Without it, from the environment:

- s3: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION`,
  `AWS_PROFILE` (the file: `key_id`, `secret_key`, `session_token`, `region`, `profile`);
- gs: `GOOGLE_APPLICATION_CREDENTIALS`, a JSON key file (the file: its path); without one, the
  machine's attached service account, else anonymous;
- as: `AZURE_STORAGE_ACCOUNT` (instead of the URL's account), `AZURE_STORAGE_KEY` (shared key),
  `AZURE_STORAGE_AUTH_TYPE` (`key`, `managed_identity`: Azure Managed Identity, user-assigned with
  `AZURE_STORAGE_CLIENT_ID`; `default`: azure-identity's DefaultAzureCredential chain), and
  neither key nor auth type: anonymous (the file: `account_str`, `account_key`, `auth_type`,
  `client_id`).

Beyond Triton, for endpoints of one's own (an emulator, a private cloud): `AZURE_STORAGE_CONNECTION_STRING`
(Azure's own variable: the endpoint and its key, used as given, before any other Azure setting) and `STORAGE_EMULATOR_HOST` (the
Google client libraries' variable: the GCS endpoint, read anonymously).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CREDENTIAL_FILE = "TRITON_CLOUD_CREDENTIAL_PATH"
BLOB_HOST = ".blob.core.windows.net"


class CredentialError(Exception):
    """The credential file cannot be read, or names nothing for this URL."""


@dataclass(frozen=True)
class S3Auth:
    key_id: str = ""
    secret_key: str = ""
    session_token: str = ""
    region: str = ""
    profile: str = ""


@dataclass(frozen=True)
class GcsAuth:
    credentials_path: str = ""  # a JSON key file; "" -> the machine's account, else anonymous
    endpoint: str = ""  # STORAGE_EMULATOR_HOST: an endpoint of one's own, read anonymously


@dataclass(frozen=True)
class AzureAuth:
    account: str
    kind: str  # "key", "managed_identity", "default", "anonymous" or "connection_string"
    key: str = ""
    client_id: str = ""  # a user-assigned managed identity's
    connection_string: str = ""


def from_file(scheme: str, url: str, env: Mapping[str, str]) -> Any | None:
    """The credential file's entry for `url` (None without the file), as Triton matches it."""
    path = env.get(CREDENTIAL_FILE)
    if path is None:
        return None
    try:
        with open(path) as f:
            entries = json.load(f).get(scheme) or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise CredentialError(f"cannot read {CREDENTIAL_FILE} {path}: {exc}") from None
    if not isinstance(entries, dict):
        raise CredentialError(f"{CREDENTIAL_FILE} {path}: '{scheme}' must map path prefixes to credentials")
    names = sorted((name for name in entries if url.startswith(name)), key=len, reverse=True)
    if not names:
        raise CredentialError(f"Cannot match credential for path  {url}")
    entry = entries[names[0]]
    shape = str if scheme == "gs" else dict  # gs: a key file's path; s3 and as: their fields
    if not isinstance(entry, shape):
        kind = "a key file's path" if shape is str else "an object of fields"
        raise CredentialError(f"{CREDENTIAL_FILE} {path}: the '{scheme}' entry '{names[0]}' must be {kind}")
    return entry


def s3_auth(url: str, env: Mapping[str, str] = os.environ) -> S3Auth:
    entry = from_file("s3", url, env)
    if entry is None:
        return S3Auth(
            env.get("AWS_ACCESS_KEY_ID", ""),
            env.get("AWS_SECRET_ACCESS_KEY", ""),
            env.get("AWS_SESSION_TOKEN", ""),
            env.get("AWS_DEFAULT_REGION", ""),
            env.get("AWS_PROFILE", ""),
        )
    fields = ("key_id", "secret_key", "session_token", "region", "profile")
    return S3Auth(**{name: str(entry.get(name, "")) for name in fields})


def gcs_auth(url: str, env: Mapping[str, str] = os.environ) -> GcsAuth:
    entry = from_file("gs", url, env)
    path = env.get("GOOGLE_APPLICATION_CREDENTIALS", "") if entry is None else str(entry)
    endpoint = env.get("STORAGE_EMULATOR_HOST", "")
    if endpoint and "://" not in endpoint:
        endpoint = f"http://{endpoint}"
    return GcsAuth(path, endpoint)


def azure_auth(url: str, env: Mapping[str, str] = os.environ) -> AzureAuth:
    """as://account/container/path (the account may be given as `<account>.blob.core.windows.net`)."""
    host = url.split("://", 1)[1].split("/", 1)[0]
    entry = from_file("as", url, env)
    if entry is None:
        account, kind = env.get("AZURE_STORAGE_ACCOUNT", ""), env.get("AZURE_STORAGE_AUTH_TYPE", "")
        key, client_id = env.get("AZURE_STORAGE_KEY", ""), env.get("AZURE_STORAGE_CLIENT_ID", "")
    else:
        account, kind = str(entry.get("account_str", "")), str(entry.get("auth_type", ""))
        key, client_id = str(entry.get("account_key", "")), str(entry.get("client_id", ""))
    connection = env.get("AZURE_STORAGE_CONNECTION_STRING", "")
    account = account or host.removesuffix(BLOB_HOST)
    if connection:  # first: adlfs itself prefers it to any credential it is given
        return AzureAuth(account, "connection_string", connection_string=connection)
    if kind in ("managed_identity", "default"):
        return AzureAuth(account, kind, client_id=client_id if kind == "managed_identity" else "")
    if key:  # Triton: a key given and no auth type is "key"; "key" without one is anonymous
        return AzureAuth(account, "key", key=key)
    return AzureAuth(account, "anonymous")

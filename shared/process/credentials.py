"""NATS identities for Shoal's services: one nkey per kind, made in Python, and the nats-server
configuration that admits them (docs/security.md, docs/design.md §9).

An identity is an nkey user seed (`SU...`) in a file of its own, `<kind>.nk`, readable by its user
only: `--nats-credentials FILE` on a service. nats-server knows only the public key (`U...`) and the
kind's permissions (`shared/wire/permissions.py`), written as an `authorization` block that
`shoal serve` puts into its embedded server's configuration and `shoal credentials` into a file
that a compose NATS includes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import nkeys

from shared.wire.permissions import KINDS, Permissions, for_kind

SUFFIX = ".nk"
AUTHORIZATION = "auth.conf"  # the nats-server configuration fragment, beside the seeds


def new_seed() -> bytes:
    """A fresh nkey user seed (an ed25519 key, nkeys' encoding: `SU...`)."""
    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed


def public_key(seed: bytes) -> str:
    pair = nkeys.from_seed(bytearray(seed))
    try:
        return str(pair.public_key.decode())
    finally:
        pair.wipe()


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its user can read, from its creation on (no window where others can)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, 0o600)  # a file that already existed keeps its mode through O_CREAT


@dataclass(frozen=True)
class Identities:
    """The identity files of one deployment, in `directory`."""

    directory: Path
    keys: dict[str, str]  # kind -> public key

    def file(self, kind: str) -> str:
        return str(self.directory / f"{kind}{SUFFIX}")

    def authorization(self, anonymous: str = "") -> str:
        """nats-server's `authorization` block: every identity's public key and permissions.
        `anonymous` (a kind): a client without credentials is admitted as that kind (nats-server's
        `no_auth_user`); for a test harness's own clients, never for a deployment."""
        users = [f"{{ nkey: {key}, permissions: {_permissions(for_kind(kind))} }}" for kind, key in self.keys.items()]
        extra = ""
        if anonymous:
            secret = os.urandom(16).hex()  # no one logs in as it: it is only the identity of "no credentials"
            users.append(
                f'{{ user: "{anonymous}", password: "{secret}", permissions: {_permissions(for_kind(anonymous))} }}'
            )
            extra = f'no_auth_user: "{anonymous}"\n'  # a top-level setting, after the block
        listed = ",\n".join(f"    {user}" for user in users)
        return f"authorization {{\n  users = [\n{listed}\n  ]\n}}\n{extra}"


def make(directory: Path, kinds: tuple[str, ...] = KINDS) -> Identities:
    """One new identity per kind in `directory` (made 0700 if new), and `auth.conf` beside them."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = {}
    for kind in kinds:
        for_kind(kind)  # an unknown kind stops here, before any file is written
        seed = new_seed()
        write_private(directory / f"{kind}{SUFFIX}", seed + b"\n")
        keys[kind] = public_key(seed)
    identities = Identities(directory, keys)
    write_private(directory / AUTHORIZATION, identities.authorization().encode())
    return identities


def _permissions(rights: Permissions) -> str:
    """nats-server's permissions map for one user (JSON is valid nats-server configuration)."""
    publish: dict[str, list[str]] = {"allow": rights.publish}
    subscribe: dict[str, list[str]] = {"allow": rights.subscribe}
    if rights.publish_deny:
        publish["deny"] = rights.publish_deny
    if rights.subscribe_deny:
        subscribe["deny"] = rights.subscribe_deny
    return json.dumps({"publish": publish, "subscribe": subscribe})


def load(directory: Path) -> Identities:
    """The identities `make` (or `shoal credentials`) wrote into `directory`."""
    keys = {}
    for kind in [*KINDS, *(p.stem for p in sorted(directory.glob(f"*{SUFFIX}")) if p.stem not in KINDS)]:
        path = directory / f"{kind}{SUFFIX}"
        if path.exists():
            keys[kind] = public_key(path.read_bytes().strip())
    if not keys:
        raise FileNotFoundError(
            f"no NATS identities (*{SUFFIX}) in {directory}: make them with `shoal credentials --out DIR`"
        )
    return Identities(directory, keys)

"""`shoal credentials --out DIR`: the NATS identities of a deployment that `shoal serve` does not
start (compose, a worker on another host), and the nats-server configuration that admits them.

DIR gets one nkey seed per kind of service (`<kind>.nk`, 0600), `auth.conf` (nats-server's
`authorization` block: the public keys and each kind's permissions) and `nats-server.conf`, which
includes it: `nats-server -c DIR/nats-server.conf -js`; with `--tls`, the bus's CA and TLS too
(shared/process/tls_material.py). Each service is then started with
`--nats-credentials DIR/<kind>.nk` (docs/security.md, "Compose and other hosts").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.process import credentials, tls_material
from shared.wire.permissions import ADMIN, KINDS

SERVER_CONFIG = "nats-server.conf"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="shoal credentials", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the directory to write (made 0700 if new)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave a directory that already holds identities as it is (compose runs this at every up; "
        "default: false, new identities replace the old ones)",
    )
    parser.add_argument(
        "--admin", action="store_true", help="also an identity that may do anything, for an operator's tools"
    )
    parser.add_argument(
        "--tls",
        default="",
        metavar="HOST[,HOST...]",
        help="TLS on the bus: a CA of the deployment's own and nats-server's certificate for these names and "
        "addresses (the ones clients reach it by), for clients and between cluster nodes (docs/security.md)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    hosts = [h.strip() for h in args.tls.split(",") if h.strip()]
    if args.keep and (out / credentials.AUTHORIZATION).exists():
        if hosts and not (out / tls_material.TLS_CONF).exists():  # identities made before TLS: add it
            write_server_config(out, hosts)
            print(f"{out}: identities kept, TLS added")
            return 0
        print(f"{out}: identities kept")
        return 0
    identities = credentials.make(out, KINDS + ((ADMIN,) if args.admin else ()))
    for kind in identities.keys:
        print(identities.file(kind))
    print(write_server_config(out, hosts))
    return 0


def write_server_config(out: Path, hosts: list[str]) -> Path:
    """nats-server.conf: the authorization block, and TLS for `hosts` when there are any (made here)."""
    # the blocks sit beside this file: nats-server resolves an include from its directory
    config = f'include "{credentials.AUTHORIZATION}"\n'
    if hosts:
        tls_material.make(out, hosts)
        config += f'include "{tls_material.TLS_CONF}"\n'
    credentials.write_private(out / SERVER_CONFIG, config.encode())
    return out / SERVER_CONFIG

"""TLS for the bus between hosts (docs/security.md, "TLS"): a certificate authority of the
deployment's own, nats-server's certificate signed by it, and the configuration that turns TLS on.

`shoal credentials --tls HOST,...` writes them beside the identities: `ca.pem` (the authority's
certificate: public, what every service and a worker on another host trusts), `ca-key.pem` (its
key, 0600: kept to sign again, never mounted into a service), `server.pem` and `server-key.pem`
(nats-server's, for the given host names and addresses), `tls.conf` (nats-server's `tls` block
for clients) and `cluster-tls.conf` (the routes between cluster nodes: each node shows its
certificate and checks the other's). A service trusts the authority it finds beside its own credentials file
(`shared/bus/connection.py`), so the directory that gives it its identity gives it the CA too.
Keys are EC P-256, made by `cryptography` (pyca), which signs in C.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.process.credentials import write_private

CA = "ca.pem"
CA_KEY = "ca-key.pem"
SERVER = "server.pem"
SERVER_KEY = "server-key.pem"
TLS_CONF = "tls.conf"
CLUSTER_TLS_CONF = "cluster-tls.conf"
VALID_DAYS = 825  # what browsers accept for a server certificate; a deployment makes new ones before


def make(directory: Path, hosts: list[str]) -> Path:
    """The authority, nats-server's certificate for `hosts` and `tls.conf` in `directory`; returns
    the configuration's path."""
    if not hosts:
        raise ValueError("TLS needs the names or addresses the clients reach nats-server by")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Shoal deployment CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digital signature, certificate and CRL signing
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )  # client too: a cluster node presents it to the others on its routes
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    unencrypted = serialization.NoEncryption()
    traditional = serialization.PrivateFormat.PKCS8
    write_private(directory / CA_KEY, ca_key.private_bytes(pem, traditional, unencrypted))
    write_private(directory / SERVER_KEY, key.private_bytes(pem, traditional, unencrypted))
    write_private(directory / CA, ca_cert.public_bytes(pem))
    write_private(directory / SERVER, cert.public_bytes(pem))
    _write_cluster_conf(directory)
    return _write_conf(directory)


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_conf(directory: Path) -> Path:
    """nats-server's TLS for clients (absolute paths: the file is included from other directories)."""
    block = f'cert_file: "{directory / SERVER}"\nkey_file: "{directory / SERVER_KEY}"\nca_file: "{directory / CA}"\n'
    text = f"tls {{\n{block}timeout: 2\n}}\n"
    path = directory / TLS_CONF
    write_private(path, text.encode())
    return path


def _write_cluster_conf(directory: Path) -> Path:
    """The `cluster` block's TLS for the routes between nodes (the routes themselves come from the
    nodes' flags, which nats-server applies over the file)."""
    text = (
        f'cluster {{\ntls {{\ncert_file: "{directory / SERVER}"\nkey_file: "{directory / SERVER_KEY}"\n'
        f'ca_file: "{directory / CA}"\nverify: true\ntimeout: 2\n}}\n}}\n'
    )
    path = directory / CLUSTER_TLS_CONF
    write_private(path, text.encode())
    return path

"""TLS on the bus (`shoal credentials --tls`, docs/security.md): a real nats-server started with the
configuration it writes speaks only TLS; a service finding the CA beside its identity connects over
TLS 1.3, one without it stops at once naming what is missing, and a plaintext client gets nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.bus import connection
from shared.process import natsserver
from shoal.credentials_cli import main as credentials_main


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    out = tmp_path_factory.mktemp("bus") / "credentials"
    assert credentials_main(["--out", str(out), "--tls", "localhost,127.0.0.1"]) == 0
    port, monitor = natsserver.free_port(), natsserver.free_port()
    server = subprocess.Popen(
        [natsserver.find_binary(), "-c", str(out / "nats-server.conf"), "-a", "127.0.0.1", "-p", str(port)]
        + ["-m", str(monitor)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        natsserver.wait_for_port(port, 15, server)
        yield out, port, monitor
    finally:
        server.kill()
        server.wait()


def test_a_service_with_the_ca_beside_its_identity_connects_over_tls(tls_server):
    out, port, monitor = tls_server

    async def connect() -> None:
        nc = await connection.connect(f"nats://127.0.0.1:{port}", "tls-test", str(out / "gateway.nk"))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz", timeout=10) as answer:
                connections = json.load(answer)["connections"]
            assert [c.get("tls_version") for c in connections if c.get("name") == "tls-test"] == ["1.3"]
        finally:
            await nc.close()

    asyncio.run(connect())


def test_a_service_without_the_ca_stops_at_once_naming_it(tls_server, tmp_path):
    out, port, _ = tls_server
    shutil.copy(out / "gateway.nk", tmp_path / "gateway.nk")  # the identity alone, no CA beside it
    started = time.monotonic()
    with pytest.raises(connection.BusRefused, match="ca.pem beside --nats-credentials"):
        asyncio.run(connection.connect(f"nats://127.0.0.1:{port}", "no-ca", str(tmp_path / "gateway.nk")))
    assert time.monotonic() - started < 10


def test_a_plaintext_client_is_told_tls_is_required_and_gets_nothing(tls_server):
    _, port, _ = tls_server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        info = sock.recv(4096)
        assert info.startswith(b"INFO ") and json.loads(info[5:])["tls_required"] is True
        sock.sendall(b'CONNECT {"verbose":false}\r\nSUB shoal.> 1\r\nPING\r\n')
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert b"PONG" not in answer and b"MSG" not in answer


def test_the_server_certificate_names_the_hosts_and_the_keys_are_private(tls_server):
    out, _, _ = tls_server
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for key in ("ca-key.pem", "server-key.pem"):
        assert (out / key).stat().st_mode & 0o077 == 0


def test_kept_identities_made_before_tls_get_it_added(tmp_path):
    """Compose runs `shoal credentials --keep --tls ...` at every up: a volume made before TLS keeps
    its identities and gets TLS (the cluster override includes tls.conf, which must exist)."""
    out = tmp_path / "credentials"
    assert credentials_main(["--out", str(out)]) == 0
    seed = (out / "gateway.nk").read_bytes()
    assert credentials_main(["--out", str(out), "--keep", "--tls", "nats"]) == 0
    assert (out / "gateway.nk").read_bytes() == seed
    assert 'include "tls.conf"' in (out / "nats-server.conf").read_text()
    assert (out / "ca.pem").exists() and (out / "cluster-tls.conf").exists()

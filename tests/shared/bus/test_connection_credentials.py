"""What `connect` makes of `--nats-credentials`, and of a server that refuses a connection."""

from __future__ import annotations

import logging

import nats
import pytest

from shared.bus.connection import TLS_EOF_NOTICE, BusRefused, credential_options, refusal
from shared.process import tls_material


def test_a_seed_file_or_a_creds_file(tmp_path):
    seed, creds = tmp_path / "worker.nk", tmp_path / "user.creds"
    seed.write_text("SUAAAA\n")
    creds.write_text("-----BEGIN NATS USER JWT-----\neyJ\n------END NATS USER JWT------\n")
    assert credential_options("") == {}
    assert credential_options(str(seed)) == {"nkeys_seed": str(seed)}
    assert credential_options(str(creds)) == {"user_credentials": str(creds)}


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(BusRefused, match=f"cannot read --nats-credentials {tmp_path}/none.nk"):
        credential_options(str(tmp_path / "none.nk"))


def test_an_authorization_violation_names_what_is_missing():
    violation = nats.errors.Error("nats: 'Authorization Violation'")
    assert "--nats-credentials FILE" in str(refusal(violation, "nats://h:1", ""))
    assert "refused the credentials in --nats-credentials /w.nk" in str(refusal(violation, "nats://h:1", "/w.nk"))
    assert refusal(nats.errors.Error("nats: 'Stale Connection'"), "nats://h:1", "") is None


def test_a_tls_bus_drops_asyncios_eof_notice_and_nothing_else(tmp_path, caplog):
    """asyncio's notice on every TLS close by the peer said nothing to a user: `shoal autoscale`
    printed it every look (CI's swarm test log)."""
    tls_material.make(tmp_path, ["localhost"])
    seed = tmp_path / "worker.nk"
    seed.write_text("SUAAAA\n")
    assert "tls" in credential_options(str(seed))
    asyncio_log = logging.getLogger("asyncio")
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio_log.warning(TLS_EOF_NOTICE)
        asyncio_log.warning("Executing <Task> took 1.2 seconds")
    assert [r.getMessage() for r in caplog.records] == ["Executing <Task> took 1.2 seconds"]
    credential_options(str(seed))
    assert sum(type(f).__name__ == "_TlsEofNotice" for f in asyncio_log.filters) == 1  # once per process

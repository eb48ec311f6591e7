"""Identities: one nkey per kind, files only their user reads, and the nats-server configuration
that admits them (a real nats-server parses it: tests/shoal/test_serve_security.py)."""

from __future__ import annotations

import json
import re
import stat

import nkeys
import pytest

from shared.process import credentials
from shared.wire.permissions import ADMIN, KINDS


def test_each_kind_gets_its_own_private_seed_and_the_server_only_public_keys(tmp_path):
    made = credentials.make(tmp_path / "ids")
    assert set(made.keys) == set(KINDS)
    assert stat.S_IMODE((tmp_path / "ids").stat().st_mode) == 0o700
    seeds = set()
    for kind, key in made.keys.items():
        path = tmp_path / "ids" / f"{kind}.nk"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        seed = path.read_bytes().strip()
        assert seed.startswith(b"SU") and key.startswith("U")
        assert nkeys.from_seed(bytearray(seed)).public_key.decode() == key
        seeds.add(seed)
    assert len(seeds) == len(KINDS)
    block = (tmp_path / "ids" / credentials.AUTHORIZATION).read_text()
    assert stat.S_IMODE((tmp_path / "ids" / credentials.AUTHORIZATION).stat().st_mode) == 0o600
    assert all(key in block for key in made.keys.values())
    assert not any(seed.decode() in block for seed in seeds)  # the server holds no secret


def test_the_permissions_are_the_tables(tmp_path):
    made = credentials.make(tmp_path, (KINDS[0],))
    permissions = json.loads(re.search(r"permissions: (\{.*\}) \}", made.authorization()).group(1))
    assert permissions["publish"]["deny"] and "$KV.shoal-models.>" in permissions["publish"]["deny"]


def test_load_reads_back_what_make_wrote(tmp_path):
    made = credentials.make(tmp_path, (*KINDS, ADMIN))
    assert credentials.load(tmp_path) == made
    with pytest.raises(FileNotFoundError, match="shoal credentials --out DIR"):
        credentials.load(tmp_path / "empty")


def test_a_file_that_existed_is_made_private(tmp_path):
    path = tmp_path / "seed"
    path.write_bytes(b"old")
    path.chmod(0o644)
    credentials.write_private(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_anonymous_clients_are_a_test_harness_choice(tmp_path):
    made = credentials.make(tmp_path)
    assert "no_auth_user" not in made.authorization()
    assert made.authorization(anonymous=ADMIN).endswith(f'no_auth_user: "{ADMIN}"\n')

"""shared/process/natsserver.py: a port picked for nats-server that something else takes before the server
binds it (the pick and the bind are two steps) is picked again; the profiling port is off unless
SHOAL_NATS_PROFILE_PORT names one, and then serves Go's heap profile on loopback only."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from benchmarks import nats_heap
from shared.process.natsserver import PROFILE_PORT_ENV, NatsServer, free_port, profile_port_from_env


def test_a_picked_port_taken_before_the_bind_is_picked_again():
    server = NatsServer()
    taken = server.port
    with socket.socket() as squatter:  # bound, not listening: as another process's connection
        squatter.bind(("127.0.0.1", taken))
        with server:
            assert server.port != taken and server.alive
            assert b"address already in use" in server.log_path.read_bytes()


def test_a_port_the_caller_chose_is_not_changed():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        chosen = squatter.getsockname()[1]
        server = NatsServer(port=chosen)
        with pytest.raises(RuntimeError, match="exited"):
            server.start()
        server.stop()


def test_the_profiling_port_is_off_unless_the_environment_names_one(monkeypatch):
    monkeypatch.delenv(PROFILE_PORT_ENV, raising=False)
    assert profile_port_from_env() == 0
    assert "prof_port" not in NatsServer(profile_port=profile_port_from_env()).config()
    monkeypatch.setenv(PROFILE_PORT_ENV, "70000")
    with pytest.raises(ValueError, match="not a TCP port"):
        profile_port_from_env()


def test_a_profiling_port_serves_the_heap_profile_on_loopback_only(monkeypatch):
    monkeypatch.setenv(PROFILE_PORT_ENV, str(free_port()))
    with NatsServer(profile_port=profile_port_from_env()) as server:
        stats = nats_heap.memstats(nats_heap.fetch(server.profile_port, collect=True))
        assert stats["NumGC"] >= 1 and 0 < stats["HeapAlloc"] <= stats["Sys"]
        with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/varz", timeout=5):
            pass  # the monitoring port is another one, still there
        listening = _listening_addresses(server.profile_port)
        assert listening == {"127.0.0.1"}, listening


def _listening_addresses(port: int) -> set[str]:
    """The local addresses sockets listen on at `port` (/proc/net/tcp and tcp6, state 0A)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]) if len(address) == 8 else address)
    return found

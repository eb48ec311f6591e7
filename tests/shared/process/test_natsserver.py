"""shared/process/natsserver.py: a port picked for nats-server that something else takes before the server
binds it (the pick and the bind are two steps) is picked again."""

from __future__ import annotations

import socket

import pytest

from shared.process.natsserver import NatsServer


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

"""nats-py imported with aiohttp hidden (shared/bus/nats_import.py): in a fresh interpreter, since
what is imported is the process's own state."""

from __future__ import annotations

import subprocess
import sys

from shared.bus.nats_import import wants_websockets

PROBE = """
import sys
from shared.bus.nats_import import import_nats_without_websockets
import_nats_without_websockets()
import nats.aio.client, nats.aio.transport
print("aiohttp" in sys.modules, nats.aio.transport.aiohttp is None)
import aiohttp  # unhidden: whatever imports it later gets it
print("aiohttp" in sys.modules)
"""


def test_nats_comes_without_aiohttp_which_stays_importable():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True", "True"], out.stderr


def test_a_process_that_already_has_aiohttp_is_left_alone():
    probe = "import aiohttp\n" + PROBE
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "False", "True"], out.stderr


def test_websocket_urls_are_recognised():
    assert not wants_websockets(["nats://127.0.0.1:4222", "tls://h:4222"])
    assert wants_websockets(["nats://a:4222", " WS://b:80"])
    assert wants_websockets(["wss://c"])

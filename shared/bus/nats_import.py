"""nats-py imported without aiohttp, in a process that makes no websocket connection.

nats-py imports aiohttp at its own import, for websocket connections (`ws://`, `wss://`) only:
about 10 MB resident and 0.6 s of CPU a process (docs/performance.md). Shoal's services and a
python model's process connect over `nats://` or `tls://`, so a process hides aiohttp while
nats-py is imported, then unhides it: anything that imports aiohttp later (s3fs, gcsfs and adlfs
in the repository, `shoal perf`, a model) gets it. A process that must reach NATS over a websocket
does not call this (`wants_websockets`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def wants_websockets(urls: Iterable[str]) -> bool:
    """Whether any of these NATS URLs is a websocket one."""
    return any(url.strip().lower().startswith(("ws://", "wss://")) for url in urls)


def import_nats_without_websockets() -> None:
    """Before anything imports nats-py: import it with aiohttp hidden (a no-op once either is in)."""
    if "aiohttp" in sys.modules or "nats.aio.transport" in sys.modules:
        return
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # `import aiohttp` raises ImportError
    try:
        import nats.aio.transport  # noqa: F401  (its `aiohttp` stays None)
    finally:
        if "aiohttp" in sys.modules and sys.modules["aiohttp"] is None:
            del sys.modules["aiohttp"]

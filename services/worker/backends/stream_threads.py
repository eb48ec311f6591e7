"""Threads that answer decoupled requests after `execute` returned (Triton's response factories).

Triton's repeat and square backends start a thread per request that sends its responses, with
delays, after the request was released. Here each such thread waits on one event instead of
sleeping, so that unloading the model ends them at once: a request still streaming then ends
with an UNAVAILABLE error instead of keeping the instance (and its worker's shutdown) waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from services.worker.backends.runner import ModelError, Piece, ResponseStream
from shared.errors import Code

UNLOADED = "the model was unloaded while this request was streaming"


class Stopped(Exception):
    """The model is being unloaded: the thread ends its stream and returns."""


class StreamThreads:
    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, stream: ResponseStream, body: Callable[[], None]) -> None:
        """Run `body` on a thread of its own; `Stopped` inside it ends `stream` with an error."""

        def run() -> None:
            try:
                body()
            except Stopped:
                if not stream.closed:
                    stream.send(Piece(error=ModelError(UNLOADED, Code.UNAVAILABLE), final=True))
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=f"{self.name}-responses", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or raise `Stopped` as soon as the model is unloaded."""
        if self._stop.wait(seconds) if seconds > 0 else self._stop.is_set():
            raise Stopped

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout_s)

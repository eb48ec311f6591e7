"""python_backend's `InferenceResponseSender` (`request.get_response_sender()`), re-exported by
`pb_utils` under Triton's names."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from services.worker.python.triton_api.triton_errors import TritonModelException

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
InferenceResponse = Any  # pb_utils.InferenceResponse, which imports this module: the sender only passes it on


class InferenceResponseSender:
    """`request.get_response_sender()`. A decoupled model's responses go out as they are sent; a
    non-decoupled model (python_backend since 23.10) may send its request's one response this way
    instead of returning it, with the rules and texts of python_backend's response_sender.cc."""

    def __init__(
        self,
        send: Callable[[InferenceResponse | None, int], None],
        cancelled: Callable[[], bool],
        decoupled: bool = True,
    ) -> None:
        self._send, self._cancelled = send, cancelled
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            self._count(response, flags)
            self._send(response, flags)

    def _count(self, response: InferenceResponse | None, flags: int) -> None:
        """Check a response (or a bare final flag) against what was sent before, and count it."""
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and not flags:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if not self._decoupled:
            if response is not None and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            if response is None and not self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
                )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self._closed = bool(flags)
        self._sent += 1

    def _returned(self, response: InferenceResponse) -> None:
        """A non-decoupled `execute` returned `response` for this request: as python_backend's stub,
        that counts as sending it with the final flag (an error if the sender sent one already)."""
        with self._lock:
            self._count(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _close(self) -> None:
        """`execute` failed: its requests are answered with the error, the model sends no more."""
        with self._lock:
            self._closed = True

    def is_cancelled(self) -> bool:
        return self._cancelled()

    @property
    def closed(self) -> bool:
        return self._closed

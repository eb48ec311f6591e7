"""A non-decoupled python model's request answered through its response sender.

Since 23.10 python_backend lets a model that is not decoupled send its request's one response
with `request.get_response_sender().send(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL)`
and return None, from `execute`, `async def execute` or a thread or task that outlives them.
The sender (`triton_api/response_sender.py`) enforces the one-response rule; a `SingleResponse`
keeps what it was sent until the instance collects it as the request's result.
"""

from __future__ import annotations

import threading
import time
import weakref

from services.worker.backends.runner import ModelError, Result, Work
from services.worker.python.triton_api import pb_utils
from shared.errors import Code

POLL_S = 0.05  # how often a wait looks at the request's cancellation and deadline


def returned(response: pb_utils.InferenceResponse) -> Result:
    """A response a model made, as the request's result: its outputs, or its error."""
    error = response.error() if response.has_error() else None
    if error is not None:
        return ModelError(error.message(), error.code_name())
    return {t.name(): t.as_numpy() for t in response.output_tensors()}


class SingleResponse:
    """Where a non-decoupled request's response goes when the model sends it."""

    def __init__(self) -> None:
        self.result: Result | None = None
        self._final = threading.Event()
        self._held: tuple[weakref.ref, ...] = ()

    def watch(self, request: pb_utils.InferenceRequest) -> None:
        """Hold the request and its sender weakly: once the model holds neither (no thread, task or
        attribute of its keeps them), nobody can answer it any more."""
        self._held = (weakref.ref(request), weakref.ref(request.get_response_sender()))

    def _abandoned(self) -> bool:
        return all(ref() is None for ref in self._held) and not self._final.is_set()

    def send(self, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        """Called by the request's sender once it accepted the response (or the final flag)."""
        if response is not None:
            self.result = returned(response)
        if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._final.set()

    def wait(self, work: Work, deadline_ns: int) -> Result:
        """The response, once the model sent the final flag. The instance waits here for a model
        that answers after `execute` returned (python_backend's instance would take its next
        batch meanwhile); a client that cancels, a deadline that passes or a request the model
        let go of unanswered ends the wait."""
        while not self._final.wait(POLL_S):
            if self._abandoned():  # python_backend would leave its client waiting for good
                return ModelError("execute returned None for a request it did not reschedule", Code.INTERNAL)
            if work.context.cancelled():
                return ModelError("request was cancelled", Code.CANCELLED)
            if deadline_ns and time.time_ns() > deadline_ns:
                return ModelError("Request timeout expired", Code.UNAVAILABLE)
        assert self.result is not None  # the sender refuses a final flag before a response
        return self.result

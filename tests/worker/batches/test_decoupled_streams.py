"""services/worker/batches/decoupled_streams.py: a stream remembers when its model sent the first
response (the scheduler's time to first response); a bare final flag is no response."""

from __future__ import annotations

import time

import numpy as np

from services.worker.backends.runner import ModelError, Piece
from services.worker.batches.decoupled_streams import ResponseStream
from shared.errors import Code


def test_the_first_response_is_timed_and_a_bare_final_flag_is_none():
    sent: list[Piece] = []
    stream = ResponseStream(lambda piece, late: sent.append(piece))
    stream.send(Piece(final=True))
    assert stream.first_ns == 0 and stream.closed
    before = time.time_ns()
    stream = ResponseStream(lambda piece, late: sent.append(piece))
    stream.send(Piece(outputs={"Y": np.zeros(1)}))
    first = stream.first_ns
    stream.send(Piece(outputs={"Y": np.zeros(1)}, final=True))
    assert before <= first <= time.time_ns() and stream.first_ns == first and len(sent) == 3


def test_an_error_is_a_response():
    stream = ResponseStream(lambda piece, late: None)
    stream.send(Piece(error=ModelError("bad", Code.INTERNAL), final=True))
    assert stream.first_ns > 0


def test_a_first_response_after_the_completion_is_late_once():
    """The completion took the time (none yet): the first response carries its own, the next none."""
    lates: list[int] = []
    stream = ResponseStream(lambda piece, late: lates.append(late))
    assert stream.report() == 0
    stream.send(Piece(outputs={"Y": np.zeros(1)}))
    stream.send(Piece(outputs={"Y": np.zeros(1)}, final=True))
    assert lates == [stream.first_ns, 0] and stream.first_ns > 0


def test_a_first_response_before_the_completion_is_in_it():
    lates: list[int] = []
    stream = ResponseStream(lambda piece, late: lates.append(late))
    stream.send(Piece(outputs={"Y": np.zeros(1)}))
    assert stream.report() == stream.first_ns > 0 and lates == [0]

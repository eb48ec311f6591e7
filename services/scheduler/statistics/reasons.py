"""Triton's failure reasons: the `reason` label of `nv_inference_request_failure`."""

from __future__ import annotations

from enum import StrEnum


class FailReason(StrEnum):
    REJECTED = "REJECTED"  # the server gave up on it: queue full, queue timeout, past its deadline
    CANCELED = "CANCELED"  # the client went away
    BACKEND = "BACKEND"  # the model failed it
    OTHER = "OTHER"  # anything else (refused before queueing, a lost worker)

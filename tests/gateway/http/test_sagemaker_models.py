"""What SageMaker's multi-model endpoint answers for a failed load or invoke
(services/gateway/http/sagemaker_models.py, as src/sagemaker_server.cc's SageMakerMMECheckOOMError)."""

from __future__ import annotations

import json

import pytest

from services.gateway.http.sagemaker_models import failed


def error(text: str, status: int = 500) -> tuple[int, bytes, dict[str, str]]:
    return status, json.dumps({"error": text}).encode(), {"content-type": "application/json"}


@pytest.mark.parametrize("text", ["CUDA out of memory. Tried", "MemoryError: x", "No space left on device"])
def test_running_out_of_memory_is_a_507(text):
    assert failed(error(text))[0] == 507


@pytest.mark.parametrize("status", [404, 500, 503])
def test_any_other_failure_is_a_400_with_its_error(status):
    assert failed(error("unknown model", status)) == (400, *error("unknown model")[1:])


def test_a_success_is_unchanged():
    assert failed((200, b"{}", {})) == (200, b"{}", {})

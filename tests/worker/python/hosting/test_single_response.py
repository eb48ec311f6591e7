"""A non-decoupled python model answering through its requests' response senders, one `execute`
call at a time on a `PythonInstance` (python_backend's rules, qa/L0_backend_python/response_sender)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.worker.backends import Placement
from services.worker.backends.runner import Batch, ModelError, RequestContext, Work
from services.worker.python.hosting.python_backend import PythonInstance
from shared.config.model_config import spec_from_json
from tests.integration import sender_models as models

CONFIG = {
    "name": "sender",
    "backend": "python",
    "max_batch_size": 8,
    "input": [
        {"name": "IN", "data_type": "TYPE_FP32", "dims": [1]},
        {"name": "MODE", "data_type": "TYPE_INT32", "dims": [1]},
    ],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
}


@pytest.fixture(params=["execute", "async execute"])
def instance(request: pytest.FixtureRequest, tmp_path: Path):
    path = tmp_path / "model.py"
    path.write_text(models.MODEL if request.param == "execute" else models.ASYNC_MODEL)
    running = PythonInstance(spec_from_json(CONFIG), path, Placement(1, "KIND_CPU", 0, 1, "sender_0"))
    yield running
    running.close()


def run(instance: PythonInstance, *modes: int, cancelled: bool = False) -> list:
    work = [
        Work(
            {"IN": np.array([[10.0 * i]], np.float32), "MODE": np.array([[mode]], np.int32)},
            ["OUT"],
            context=RequestContext(cancelled=lambda: cancelled),
        )
        for i, mode in enumerate(modes)
    ]
    return instance.execute(Batch(work))


def out(result: object) -> float:
    assert isinstance(result, dict), result
    return float(result["OUT"].item())


def test_sent_returned_and_later_answers_in_one_batch(instance):
    results = run(instance, models.SEND, models.RETURN, models.LATER, models.SEND_THEN_FINAL)
    assert [out(r) for r in results] == [1.0, 10.0, 21.0, 31.0]


def test_none_returned_for_every_request_sent_through_its_sender(instance):
    assert [out(r) for r in run(instance, models.SEND, models.LATER)] == [1.0, 11.0]


def test_a_second_response_fails_the_execute_but_the_first_stays(instance):
    first, other = run(instance, models.TWO, models.RETURN)
    assert out(first) == 1.0  # the client has it already in Triton too
    assert isinstance(other, ModelError)
    assert "Unable to send response. Non-decoupled model cannot send more than one response." in other.message


def test_the_final_flag_before_a_response_is_an_error(instance):
    (result,) = run(instance, models.FINAL_ONLY)
    assert isinstance(result, ModelError)
    assert "Non-decoupled model cannot send complete final before sending a response" in result.message


def test_sending_and_returning_keeps_the_sent_response(instance):
    sent, other = run(instance, models.SEND_AND_RETURN, models.RETURN)
    assert out(sent) == 1.0
    assert isinstance(other, ModelError)
    assert other.message == "Unable to send response. Non-decoupled model cannot send more than one response."


def test_a_cancelled_request_stops_the_wait(instance):
    (result,) = run(instance, models.LATER, cancelled=True)
    assert isinstance(result, ModelError) and result.code == "CANCELLED"


@pytest.mark.parametrize("define", ["def", "async def"])
def test_a_request_nobody_can_answer_fails_at_once(tmp_path, define):
    """python_backend would leave the client waiting; here nobody holds the request or its sender."""
    path = tmp_path / "model.py"
    body = "        return [None] * len(requests)\n"
    path.write_text(f"class TritonPythonModel:\n    {define} execute(self, requests):\n{body}")
    forgetful = PythonInstance(spec_from_json(CONFIG), path, Placement(1, "KIND_CPU", 0, 1, "sender_0"))
    try:
        (result,) = run(forgetful, models.SEND)
    finally:
        forgetful.close()
    assert isinstance(result, ModelError) and "did not reschedule" in result.message

"""Triton parity V (issue 48): a non-decoupled python model answering through
`request.get_response_sender()`, from `execute` and from `async def execute`, served by `shoal serve`
with each request's model in an instance process (the default) and in the worker itself, driven by
tritonclient as Triton's qa/L0_backend_python/response_sender drives its models."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shared.process.natsserver import free_port
from tests.integration import sender_models as models
from tests.shoal.serving import Serve, serve

MORE_THAN_ONE = "Unable to send response. Non-decoupled model cannot send more than one response."
FINAL_FIRST = "Unable to send response. Non-decoupled model cannot send complete final before sending a response."


@pytest.fixture(scope="module", params=["instance", "none"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"sender_{request.param}")
    grpc_port = free_port()
    flags = (f"--python-isolation={request.param}", f"--grpc-port={grpc_port}")
    with serve(models.write_models(root / "models"), root / "cache", *flags) as running:
        running.wait_for("Started HTTPService")
        yield running, grpc_port


def infer(served: tuple[Serve, int], model: str, mode: int, value: float = 5.0) -> float:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served[0].http_port}", network_timeout=60)
    inputs = [httpclient.InferInput("IN", [1, 1], "FP32"), httpclient.InferInput("MODE", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[value]], np.float32))
    inputs[1].set_data_from_numpy(np.array([[mode]], np.int32))
    try:
        return float(client.infer(model, inputs).as_numpy("OUT").item())
    finally:
        client.close()


@pytest.mark.parametrize("model", ["sender", "sender_async"])
@pytest.mark.parametrize("mode", [models.SEND, models.SEND_THEN_FINAL, models.LATER])
def test_one_response_sent_is_the_answer(served, model, mode):
    assert infer(served, model, mode) == 6.0


@pytest.mark.parametrize("model", ["sender", "sender_async"])
def test_a_returned_response_still_answers(served, model):
    assert infer(served, model, models.RETURN) == 5.0


@pytest.mark.parametrize("model", ["sender", "sender_async"])
def test_the_final_flag_before_a_response_fails_the_request(served, model):
    with pytest.raises(InferenceServerException, match=FINAL_FIRST):
        infer(served, model, models.FINAL_ONLY)


@pytest.mark.parametrize("model", ["sender", "sender_async"])
@pytest.mark.parametrize("mode", [models.TWO, models.SEND_AND_RETURN])
def test_a_second_response_is_refused_and_the_first_answers(served, model, mode):
    """As in Triton: the first response reaches the client; the error goes to the log."""
    assert infer(served, model, mode) == 6.0
    raised = "TritonModelException: " if mode == models.TWO else ""  # the model's own send raised
    served[0].wait_for(f"Failed to process the request(s) for model '{model}', message: {raised}{MORE_THAN_ONE}", 30)


def test_grpc_gets_the_sent_response(served):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served[1]}")
    inputs = [grpcclient.InferInput("IN", [1, 1], "FP32"), grpcclient.InferInput("MODE", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[1.0]], np.float32))
    inputs[1].set_data_from_numpy(np.array([[models.LATER]], np.int32))
    try:
        assert client.infer("sender_async", inputs).as_numpy("OUT").item() == 2.0
    finally:
        client.close()

"""Triton parity V (issue 48, item 3): a python model cancels the decoupled BLS stream it reads
(`ResponseIterator.cancel()`, python_backend since 24.xx), as Triton's qa/L0_backend_python/decoupled
tests it (test_decoupled_bls_cancel, _ignore_cancel, _cancel_after_cancellation/_completion):
the callee sees `request.is_cancelled()` and ends its stream with a CANCELLED error the caller
reads; a callee that ignores the cancel keeps streaming to its end; a cancel after the stream ended
is a no-op. Served by `shoal serve` with python models in instance processes and in the worker,
driven by tritonclient; afterwards the callee has nothing pending."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from shared.process.natsserver import free_port
from tests.integration import bls_cancel_models as models
from tests.serving import wait_until
from tests.shoal.serving import Serve, serve

CALLEE = "response_sender_until_cancelled"


@pytest.fixture(scope="module", params=["instance", "none"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"bls_cancel_{request.param}")
    grpc_port, metrics_port = free_port(), free_port()
    flags = (f"--python-isolation={request.param}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}")
    with serve(models.write_models(root / "models"), root / "cache", *flags) as running:
        running.wait_for("Started HTTPService")
        yield running, grpc_port, metrics_port


def call(served: tuple[Serve, int, int], model: str, max_sum: int, ignore_cancel: bool) -> tuple[int, bool]:
    inputs = [
        grpcclient.InferInput("INPUT", [1], "INT32"),
        grpcclient.InferInput("MAX_SUM", [1], "INT32"),
        grpcclient.InferInput("IGNORE_CANCEL", [1], "BOOL"),
    ]
    inputs[0].set_data_from_numpy(np.array([1], np.int32))
    inputs[1].set_data_from_numpy(np.array([max_sum], np.int32))
    inputs[2].set_data_from_numpy(np.array([ignore_cancel], np.bool_))
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served[1]}")
    try:
        result = client.infer(model, inputs, client_timeout=120)
    finally:
        client.close()
    return int(result.as_numpy("SUM")[0]), bool(result.as_numpy("IS_CANCELLED")[0])


def pending(metrics_port: int, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    found = re.search(rf'^nv_inference_pending_request_count{{model="{model}",[^}}]*}} (\S+)$', text, re.M)
    assert found is not None, text
    return float(found.group(1))


def nothing_pending(served: tuple[Serve, int, int]) -> None:
    for model in (CALLEE, *models.CALLERS, "decoupled_bls_cancel_queued"):
        wait_until(lambda m=model: pending(served[2], m) == 0, 30, f"{model} has nothing pending")


@pytest.mark.parametrize("model", ["decoupled_bls_cancel", "decoupled_bls_async_cancel"])
def test_a_cancelled_stream_ends_with_the_callees_cancelled_error(served, model):
    """qa test_decoupled_bls_cancel: the stream stopped at the cancel (SUM from MAX_SUM, short of
    all 20 responses) with the CANCELLED error the callee sent once it saw is_cancelled()."""
    total, cancelled = call(served, model, 10, False)
    assert 10 <= total < 20 and cancelled
    nothing_pending(served)


@pytest.mark.parametrize("model", ["decoupled_bls_cancel", "decoupled_bls_async_cancel"])
def test_a_callee_ignoring_the_cancel_streams_to_its_end(served, model):
    """qa test_decoupled_bls_ignore_cancel: the iterator still yields all 20 responses."""
    assert call(served, model, 10, True) == (20, False)
    nothing_pending(served)


def test_cancel_after_the_cancelled_stream_ended_is_a_no_op(served):
    """qa test_decoupled_bls_cancel_after_cancellation."""
    total, cancelled = call(served, "decoupled_bls_cancel_after_complete", 10, False)
    assert 10 <= total < 20 and cancelled


def test_a_stream_cancelled_in_its_queue_ends_with_cancelled(served):
    """Triton's core finishes a request cancelled in its queue with CANCELLED: the caller's
    iterator ends at once with that error, no response of the callee (which never ran it)."""
    assert call(served, "decoupled_bls_cancel_queued", 1, False) == (0, True)
    nothing_pending(served)


def test_cancel_after_the_stream_completed_is_a_no_op(served):
    """qa test_decoupled_bls_cancel_after_completion: MAX_SUM 25 is never reached (20 responses)."""
    assert call(served, "decoupled_bls_cancel_after_complete", 25, False) == (20, False)
    nothing_pending(served)

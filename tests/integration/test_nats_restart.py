"""nats-server restarts: every service reconnects by itself, requests meanwhile end by their
deadline with a clear error, and the control plane (KV watches) works again afterwards."""

from __future__ import annotations

import time

import numpy as np
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import identity_config, running_cluster


def infer(client, model: str) -> None:
    value = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(value)
    np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT0"), value)


def test_services_recover_from_a_nats_restart(tmp_path):
    for name in ("first", "second"):
        examples.write_model(
            tmp_path, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32")
        )
    with running_cluster(
        tmp_path, repository={"model_control_mode": "explicit", "load_model": ["first"]}, request_timeout_s=3
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=30)
        infer(client, "first")
        running.nats.restart()
        deadline = time.monotonic() + 60
        while True:
            started = time.monotonic()
            try:
                infer(client, "first")
                break
            except InferenceServerException as exc:  # while services reconnect: clear errors only
                assert exc.status() in ("503", "500", "404"), exc
                assert exc.message()
            assert time.monotonic() - started < 10, "a request outlived its deadline"
            assert time.monotonic() < deadline, "serving did not resume after the NATS restart"
            time.sleep(0.1)
        # the control plane works again: a load goes through the KV watches of every service
        client.load_model("second")
        infer(client, "second")
        client.close()

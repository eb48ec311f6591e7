"""Liveness while loading (issue 17): a slow load, and a repository of many models.

A load must never count as the worker's death: not a model whose `initialize` takes longer
than the heartbeat timeout (even holding the GIL), not a repository of many models loading at
once. Each test starts its own cluster on the generated repository, with the defaults users get
(the cluster fixture's short worker timeout makes a missed heartbeat show within seconds).
"""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.integration.many_models import DATATYPES, write_many_models

DEAD = "stopped sending heartbeats"
# Sleeps (the GIL free), then holds the GIL in one regular-expression match for longer than the
# cluster's 3 s worker timeout: no thread of the process runs meanwhile, the heartbeat's included.
SLOW_MODEL = textwrap.dedent(
    """
    import re
    import time

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            time.sleep(2)
            n = 18
            while True:  # each step doubles the time the match holds the GIL
                started = time.perf_counter()
                re.match(r"(a+)+$", "a" * n + "b")
                if time.perf_counter() - started > 3.5:
                    break
                n += 1

        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
    """
)


def _infer(client: httpclient.InferenceServerClient, name: str, datatype: str) -> None:
    if datatype == "BYTES":
        array = np.array([[b"a", b"b"]], dtype=object)
    else:
        array = np.ones((1, 2), dtype=np.dtype(examples_numpy(datatype)))
    tensor = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    result = client.infer(name, [tensor])
    assert np.array_equal(result.as_numpy("OUTPUT0"), array), name


def examples_numpy(datatype: str) -> type:
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


def _states(client: httpclient.InferenceServerClient) -> dict[str, str]:
    return {m["name"]: m.get("state", "") for m in client.get_model_repository_index()}


def test_a_load_longer_than_the_heartbeat_timeout_marks_nothing_dead(tmp_path: Path, capfd):
    root = tmp_path / "models"
    examples.write_model(
        root, "fast", examples.identity_graph(TensorProto.FLOAT, 2, "fast"), identity_config("fast", "FP32")
    )
    slow = root / "slow"
    (slow / "1").mkdir(parents=True)
    (slow / "1" / "model.py").write_text(SLOW_MODEL)
    (slow / "config.pbtxt").write_text(
        identity_config("slow", "FP32").replace('backend: "onnxruntime"', 'backend: "python"')
    )
    with running_cluster(root) as shoal:  # returns once every model is READY
        client = httpclient.InferenceServerClient(shoal.url)
        assert _states(client) == {"fast": "READY", "slow": "READY"}
        _infer(client, "fast", "FP32")
        _infer(client, "slow", "FP32")
        assert DEAD not in capfd.readouterr().err  # read before the stop: stopping workers stop beating


def _many() -> int:
    """Models in the generated repository: 200 where the cores allow, fewer on a small CI machine
    (benchmarks/many_models.py starts the full 200 and reports the times)."""
    return int(os.environ.get("SHOAL_MANY_MODELS", "200" if (os.cpu_count() or 1) >= 8 else "60"))


@pytest.mark.timeout(300)
def test_a_repository_of_many_models_loads_and_serves(tmp_path: Path, capfd):
    names = write_many_models(tmp_path / "models", _many(), ensembles=2, python_models=1)
    started = time.monotonic()
    with running_cluster(tmp_path / "models") as shoal:
        ready_s = time.monotonic() - started
        client = httpclient.InferenceServerClient(shoal.url)
        states = _states(client)
        assert {n: s for n, s in states.items() if s != "READY"} == {}
        assert sorted(states) == sorted(names)
        for name in names:
            datatype = name.rsplit("_", 1)[1].upper() if name.startswith("m") else "FP32"
            _infer(client, name, datatype if datatype in DATATYPES else "FP32")
        assert DEAD not in capfd.readouterr().err, f"ready after {ready_s:.0f} s"

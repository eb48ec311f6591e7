"""PyTorch 2 programs (`model.pt2`, `platform: "torch_aoti"`) through the real services, called with
the official clients over HTTP and gRPC and compared with the module's own answer; the load
errors Triton's PyTorch backend gives, as the repository index reports them."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cluster import Running, running_cluster

torch = pytest.importorskip("torch", reason="PT2 models need torch: pip install 'shoal[torch]'")
from tests.integration import pt2_models  # noqa: E402 (needs torch)

CLIENTS = ("http", "grpc")
# compiling the AOTInductor package takes ~25 s on an idle 2-core machine, minutes on a loaded one
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def pt2_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str]]:
    root = tmp_path_factory.mktemp("pt2_models")
    aoti = ""  # why the AOTInductor package is missing, if it is
    with warnings.catch_warnings():  # torch's own modules (inductor's imports) warn of TorchScript's deprecation
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)  # and of its own pytree API, from within torch.export
        pt2_models.exported_models(root)
        if pt2_models.compiler() is None:
            aoti = "no C++ compiler (g++) for AOTInductor on this host"
        else:
            pt2_models.aoti_model(root)
    with running_cluster(root) as running:
        yield running, aoti


def _client(running: Running, kind: str):
    return (
        httpclient.InferenceServerClient(running.url)
        if kind == "http"
        else grpcclient.InferenceServerClient(running.grpc_url)
    )


def _infer(running: Running, kind: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str]):
    module = httpclient if kind == "http" else grpcclient
    tensors = []
    for name, value in inputs.items():
        tensor = module.InferInput(name, list(value.shape), "BF16" if value.dtype == ml_dtypes.bfloat16 else "FP32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    wanted = [module.InferRequestedOutput(name) for name in outputs]
    result = _client(running, kind).infer(model, tensors, outputs=wanted)
    return {name: result.as_numpy(name) for name in outputs}


@pytest.mark.parametrize("kind", CLIENTS)
def test_exported_program_with_triton_names_answers_as_the_module(pt2_cluster, kind):
    running, _ = pt2_cluster
    a, b, opt, k = pt2_models.rows(3)
    expected = pt2_models.Complex()(a, b, {"opt": opt}, k=k)
    inputs = {"ARGS[0]": a, "ARGS[1]": b, "ARGS[2][opt]": opt, "KWARGS[k]": k}
    got = _infer(
        running,
        kind,
        "pt2_complex",
        {n: t.numpy() for n, t in inputs.items()},
        ["RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "OUTPUT__3", "RESULT[K]"],
    )
    np.testing.assert_allclose(got["RESULT[AAA]"], expected["AAA"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(got["RESULT[ZZZ]"], expected["ZZZ"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(got["RESULT[BBB][0]"], expected["BBB"][0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got["OUTPUT__3"], opt.numpy())  # RESULT[BBB][1] by its ordinal
    np.testing.assert_allclose(got["RESULT[K]"], expected["K"].numpy(), rtol=1e-6)


@pytest.mark.parametrize("kind", CLIENTS)
def test_aoti_package_answers_as_the_module_at_several_batch_sizes(pt2_cluster, kind):
    running, missing = pt2_cluster
    if missing:
        pytest.skip(missing)
    assert _client(running, "http").get_model_metadata("pt2_aoti")["platform"] == "torch_aoti"
    for rows in (1, 4, 8):
        a, b = pt2_models.rows(rows)[:2]
        plus, minus = pt2_models.AddSub()(a, b)
        got = _infer(
            running, kind, "pt2_aoti", {"INPUT__0": a.numpy(), "INPUT__1": b.numpy()}, ["OUTPUT__0", "OUTPUT__1"]
        )
        np.testing.assert_allclose(got["OUTPUT__0"], plus.numpy(), rtol=1e-6)
        np.testing.assert_allclose(got["OUTPUT__1"], minus.numpy(), rtol=1e-6)


@pytest.mark.parametrize("kind", CLIENTS)
def test_bf16_in_and_out_of_a_pt2_program(pt2_cluster, kind):
    running, _ = pt2_cluster
    value = np.array([[1.5, -2.25, 3.0], [0.0078125, 100.0, -0.5]], dtype=ml_dtypes.bfloat16)
    got = _infer(running, kind, "pt2_bf16", {"INPUT__0": value}, ["RESULT"])["RESULT"]
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, value * 2)


def _reason(running: Running, model: str) -> str:
    index = {e["name"]: e for e in _client(running, "http").get_model_repository_index()}
    assert index[model]["state"] == "UNAVAILABLE", index[model]
    return index[model]["reason"]


def test_a_file_that_is_no_pt2_archive_fails_its_load_with_tritons_text(pt2_cluster):
    reason = _reason(pt2_cluster[0], "pt2_bad_file")
    assert 'for inductor model "pt2_bad_file": Failed to create ModelInstanceState for model "pt2_bad_file"' in reason


def test_a_config_missing_an_input_of_the_program_fails_its_load(pt2_cluster):
    reason = _reason(pt2_cluster[0], "pt2_one_input")
    assert "the config has 1 inputs but the model takes 2; missing: ARGS[1]" in reason


def test_a_name_outside_the_call_specification_fails_its_load(pt2_cluster):
    reason = _reason(pt2_cluster[0], "pt2_bad_name")
    assert 'io_data does not contain name: "INPUT0"' in reason
    assert "ARGS[0] (INPUT__0), ARGS[1] (INPUT__1)" in reason


def test_a_shape_the_program_was_not_exported_for_is_its_execution_failure(pt2_cluster):
    from tritonclient.utils import InferenceServerException

    running, _ = pt2_cluster
    a = np.ones((3, 4), np.float32)  # the config allows [-1, 4]; the program was exported for [2, 4]
    with pytest.raises(InferenceServerException) as error:
        _infer(running, "http", "pt2_static", {"INPUT__0": a, "INPUT__1": a}, ["OUTPUT__0"])
    assert error.value.status() == "500"
    assert error.value.message().startswith('Inductor model instance "pt2_static')
    assert "execution failure:" in error.value.message()
    ok = np.ones((2, 4), np.float32)
    got = _infer(running, "http", "pt2_static", {"INPUT__0": ok, "INPUT__1": ok}, ["OUTPUT__0"])
    np.testing.assert_array_equal(got["OUTPUT__0"], ok + ok)


def test_an_output_of_another_datatype_than_the_configs_is_tritons_error(pt2_cluster):
    from tritonclient.utils import InferenceServerException

    tensor = httpclient.InferInput("INPUT__0", [2, 3], "INT64")
    tensor.set_data_from_numpy(np.ones((2, 3), np.int64))
    with pytest.raises(InferenceServerException) as error:
        _client(pt2_cluster[0], "http").infer("pt2_wrong_type", [tensor])
    assert error.value.status() == "500"
    assert error.value.message().endswith(
        'output tensor "RESULT" has datatype TYPE_INT64 but model configuration expects TYPE_FP32.'
    )

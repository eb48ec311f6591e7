"""Triton's DALI auto-complete rules (dali_backend's config_tools), on what a pipeline declares:
inputs filled and made ragged, outputs in the pipeline's order with the config's names, dims -1
per declared dimension, the pipeline's batch size and dynamic batching, and the backend's texts
where the config disagrees."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from services.repository.dali_autocomplete import Pipeline, PipelineIO, autofill, unbatched
from shared.config import model_config
from shared.errors import ShoalError

PIPELINE = Pipeline(
    inputs=[PipelineIO("DALI_INPUT_0", "TYPE_UINT8", 1)],
    outputs=[PipelineIO("__Resize_1", "TYPE_FP32", 3), PipelineIO("__Cast_2", "TYPE_INT32", None)],
    max_batch_size=8,
)


def parsed(text: str) -> pb.ModelConfig:
    return model_config.parse_text(f'name: "dali"\nbackend: "dali"\n{text}')


def test_an_empty_config_is_completed_from_the_pipeline():
    config = parsed("")
    autofill(config, PIPELINE, batched=True)
    assert config.max_batch_size == 8 and config.HasField("dynamic_batching")
    assert [(i.name, pb.DataType.Name(i.data_type), list(i.dims), i.allow_ragged_batch) for i in config.input] == [
        ("DALI_INPUT_0", "TYPE_UINT8", [-1], True)
    ]
    assert [(o.name, pb.DataType.Name(o.data_type), list(o.dims)) for o in config.output] == [
        ("__Resize_1", "TYPE_FP32", [-1, -1, -1]),
        ("__Cast_2", "TYPE_INT32", []),  # no declared ndim: the dims stay the config's
    ]


def test_the_configs_names_and_dims_win_where_they_agree():
    config = parsed(
        'max_batch_size: 4\noutput [ { name: "IMAGES" dims: [ 3, -1, 224 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 5 }"
    )
    autofill(config, PIPELINE, batched=True)
    assert config.max_batch_size == 4 and config.dynamic_batching.max_queue_delay_microseconds == 5
    assert [(o.name, list(o.dims)) for o in config.output] == [("IMAGES", [3, -1, 224]), ("__Cast_2", [])]


def test_a_model_without_batching_carries_the_batch_in_its_dims():
    config = parsed("max_batch_size: 0")
    assert unbatched('name: "dali"\nmax_batch_size: 0\n') and not unbatched('name: "dali"\n')
    autofill(config, PIPELINE, batched=False)
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, -1]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'input [ { name: "OTHER" data_type: TYPE_UINT8 dims: [ -1 ] } ]',
            "Configuration file contains config for OTHER but such input is not present in the pipeline.",
        ),
        (
            'input [ { name: "DALI_INPUT_0" data_type: TYPE_FP32 dims: [ -1 ] } ]',
            'Mismatch of data_type config for "DALI_INPUT_0".\nData type defined in config: TYPE_FP32\n'
            "Data type defined in pipeline: TYPE_UINT8",
        ),
        (
            'input [ { name: "DALI_INPUT_0" dims: [ -1, 3 ] } ]',
            'Mismatch in number of dimensions for "DALI_INPUT_0"\nNumber of dimensions defined in config: 2\n'
            "Number of dimensions defined in pipeline: 1",
        ),
        (
            'output [ { name: "A" }, { name: "B" }, { name: "C" } ]',
            "The number of outputs specified in the DALI pipeline and the configuration file do not match."
            "\nModel config outputs: 3\nPipeline outputs: 2",
        ),
    ],
)
def test_the_backends_texts_where_the_config_disagrees(text, message):
    with pytest.raises(ShoalError) as raised:
        autofill(parsed(text), PIPELINE, batched=True)
    assert raised.value.message == message


def test_the_pipeline_is_read_without_the_repositorys_secrets(monkeypatch):
    """A `.py` pipeline is the model's own code, run by the repository to read it: the repository's
    bus credentials and cloud keys stay out of that child's environment."""
    from services.repository import dali_autocomplete

    for name in (
        "AWS_SECRET_ACCESS_KEY",
        "AZURE_STORAGE_KEY",
        "SHOAL_REPOSITORY_NATS_CREDENTIALS",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ):
        monkeypatch.setenv(name, "secret")
    monkeypatch.setenv("PATH", "/usr/bin")
    env = dali_autocomplete._introspection_env()
    assert env["PATH"] == "/usr/bin"
    assert "secret" not in env.values()

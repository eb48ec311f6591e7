from __future__ import annotations

from services.gateway.openai.catalog import Kind, offer, offers
from shared.config.model_config import ModelSpec, TensorSpec


def _spec(inputs, outputs, decoupled=False, **parameters) -> ModelSpec:
    return ModelSpec(
        "m",
        "",
        "python",
        0,
        tuple(TensorSpec(n, t, (1,), optional=o) for n, t, o in inputs),
        tuple(TensorSpec(n, t, (1,)) for n, t in outputs),
        None,
        1,
        "KIND_CPU",
        decoupled,
        "",
        parameters=parameters,
    )


GENERATION_IN = [("text_input", "BYTES", False), ("stream", "BOOL", False)]


def test_a_decoupled_text_model_generates_with_the_inputs_it_has():
    spec = _spec(
        [*GENERATION_IN, ("max_tokens", "INT32", True), ("temperature", "FP32", True), ("messages", "BYTES", True)],
        [("text_output", "BYTES"), ("completion_tokens", "INT64"), ("finish_reason", "BYTES")],
        decoupled=True,
    )
    found = offer(spec)
    assert found is not None and found.kind == Kind.GENERATION
    assert sorted(found.sampling) == ["max_tokens", "temperature"]
    assert found.messages is not None and found.usage == ("completion_tokens",) and found.finish_reason


def test_without_its_stream_input_or_decoupling_a_text_model_is_not_a_generator():
    assert offer(_spec(GENERATION_IN[:1], [("text_output", "BYTES")], decoupled=True)) is None
    not_decoupled = offer(_spec(GENERATION_IN, [("text_output", "BYTES")]))
    assert not_decoupled is None  # two BYTES inputs... and no FP32 output: no embedding either


def test_one_text_input_and_a_float_output_is_an_embedder():
    found = offer(_spec([("TEXT", "BYTES", False)], [("VEC", "FP32"), ("prompt_tokens", "INT32")]))
    assert found is not None and (found.kind, found.text_input, found.output, found.usage) == (
        Kind.EMBEDDING,
        "TEXT",
        "VEC",
        ("prompt_tokens",),
    )
    assert offer(_spec([("A", "FP32", False)], [("B", "FP32")])) is None


def test_the_config_parameter_overrides_the_guess():
    assert offer(_spec([("TEXT", "BYTES", False)], [("VEC", "FP32")], openai_api="none")) is None
    assert offer(_spec([("TEXT", "BYTES", False)], [("VEC", "FP32")], openai_api="generation")) is None


ADAPTERS = '{"pirate": "pirate.gguf", "poet": "/models/poet.gguf"}'


def test_each_lora_adapter_is_offered_as_a_model_of_its_own():
    spec = _spec(
        [*GENERATION_IN, ("lora_name", "BYTES", True)], [("text_output", "BYTES")], True, lora_adapters=ADAPTERS
    )
    found = offers(spec)
    assert [(o.model, o.adapter) for o in found] == [("m", None), ("m_lora_pirate", "pirate"), ("m_lora_poet", "poet")]
    assert all(o.kind == Kind.GENERATION for o in found)
    spec = _spec(
        [*GENERATION_IN, ("lora_name", "BYTES", True)],
        [("text_output", "BYTES")],
        True,
        lora_adapters=ADAPTERS,
        lora_separator="/",
    )
    assert [o.model for o in offers(spec)] == ["m", "m/pirate", "m/poet"]


def test_adapters_need_the_lora_name_input_and_a_valid_declaration():
    without_input = _spec(GENERATION_IN, [("text_output", "BYTES")], True, lora_adapters=ADAPTERS)
    assert [o.model for o in offers(without_input)] == ["m"]
    invalid = _spec(
        [*GENERATION_IN, ("lora_name", "BYTES", True)], [("text_output", "BYTES")], True, lora_adapters="[1]"
    )
    assert [o.model for o in offers(invalid)] == ["m"]
    assert offers(_spec([("A", "FP32", False)], [("B", "FP32")])) == []

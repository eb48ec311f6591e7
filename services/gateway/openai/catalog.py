"""Which models the OpenAI front end offers, and how, read from each model's config.

As Triton's OpenAI front end does (docs/openai.md, "Which models are offered"):
- a *generation* model (chat and completions) is decoupled, with a BYTES `text_input`, a BOOL
  `stream` and a BYTES `text_output`. Optional scalar inputs take the sampling parameters
  (`max_tokens`, `temperature`, `top_p`, `seed`, `frequency_penalty`, `presence_penalty`,
  `logit_bias`, `response_format`, `tools`, `tool_choice`, `parallel_tool_calls`); an optional BYTES `messages` input takes the chat as JSON,
  and then the model applies its own chat template (otherwise a `chat_template` parameter lets
  the front end apply it, `templates.py`). Optional outputs `prompt_tokens` /
  `completion_tokens` (integers) give the usage counts, and `finish_reason`
  (BYTES) says why generation ended. An integer `top_logprobs` input with a BYTES `logprobs`
  output serves OpenAI's `logprobs` (`logprobs.py`), and with them a BOOL `prompt_logprobs` input
  with a BYTES `prompt_logprobs` output the prompt's (completions' `echo` with `logprobs`);
- an *embedding* model is not decoupled, has one BYTES input and an FP32 output (the embedding),
  and optionally a `prompt_tokens` output.
A config parameter `openai_api` (`generation`, `embedding` or `none`) overrides the guess.

A generation model with a BYTES `lora_name` input and LoRA adapters in its config
(shared/config/lora_adapters.py) is offered once more per adapter, under the adapter's model name:
the same model, which is sent the adapter's name in `lora_name`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from shared.config.lora_adapters import served_names
from shared.config.model_config import ModelSpec, TensorSpec

INTEGER_TYPES = frozenset({"INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"})
FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64", "BF16"})
# OpenAI's name -> the kinds of datatype its model input may have
SAMPLING_INPUTS: dict[str, frozenset[str]] = {
    "max_tokens": INTEGER_TYPES,
    "temperature": FLOAT_TYPES,
    "top_p": FLOAT_TYPES,
    "seed": INTEGER_TYPES,
    "frequency_penalty": FLOAT_TYPES,
    "presence_penalty": FLOAT_TYPES,
    "logit_bias": frozenset({"BYTES"}),  # JSON: {"<token id>": bias}
    "response_format": frozenset({"BYTES"}),  # OpenAI's object as JSON
    "tools": frozenset({"BYTES"}),  # OpenAI's tool objects as JSON
    "tool_choice": frozenset({"BYTES"}),  # "required" or a named function as JSON: the model enforces the call
    "parallel_tool_calls": frozenset({"BOOL"}),  # false: one call at most
}
USAGE_OUTPUTS = ("prompt_tokens", "completion_tokens")


class Kind(StrEnum):
    GENERATION = "generation"
    EMBEDDING = "embedding"


@dataclass(frozen=True)
class Offer:
    """What one model serves through the OpenAI API, and with which of its tensors."""

    model: str
    kind: Kind
    text_input: str
    output: str
    sampling: dict[str, TensorSpec]  # OpenAI's parameter -> the model input that takes it
    messages: TensorSpec | None = None  # the model applies its own chat template
    usage: tuple[str, ...] = ()  # the usage outputs the model has
    finish_reason: bool = False
    batching: bool = False  # max_batch_size > 0: tensors carry a leading batch dimension
    chat: bool = False  # chat is served: by the model's `messages` input or a template in its config
    logprobs: TensorSpec | None = None  # the `top_logprobs` input, when the model also has a `logprobs` output
    prompt_logprobs: bool = False  # it scores the prompt's tokens (`prompt_logprobs` input and output)
    adapter: str | None = None  # the LoRA adapter this name serves (its model's `lora_name` input), None: the model


def offers(spec: ModelSpec) -> list[Offer]:
    """Every name `spec` is offered under: its own, then its LoRA adapters' ([] when none)."""
    served = offer(spec)
    if served is None:
        return []
    if served.kind != Kind.GENERATION or not _has(spec.input("lora_name"), "BYTES"):
        return [served]
    adapters = served_names(spec.name, spec.parameters)
    return [served, *(replace(served, model=name, adapter=adapter) for name, adapter in adapters.items())]


def offer(spec: ModelSpec) -> Offer | None:
    """How `spec` is offered, or None when the OpenAI API cannot use it."""
    wanted = spec.parameters.get("openai_api", "")
    if wanted == "none":
        return None
    if wanted != Kind.EMBEDDING and _is_generation(spec):
        return _generation(spec)
    if wanted != Kind.GENERATION and not spec.decoupled:
        return _embedding(spec)
    return None


def _has(tensor: TensorSpec | None, datatypes: frozenset[str] | str) -> bool:
    return tensor is not None and (
        tensor.datatype == datatypes if isinstance(datatypes, str) else tensor.datatype in datatypes
    )


def _is_generation(spec: ModelSpec) -> bool:
    return (
        spec.decoupled
        and _has(spec.input("text_input"), "BYTES")
        and _has(spec.input("stream"), "BOOL")
        and _has(spec.output("text_output"), "BYTES")
    )


def _generation(spec: ModelSpec) -> Offer:
    sampling = {
        name: tensor
        for name, kinds in SAMPLING_INPUTS.items()
        if (tensor := spec.input(name)) is not None and tensor.datatype in kinds
    }
    messages = spec.input("messages")
    return Offer(
        spec.name,
        Kind.GENERATION,
        "text_input",
        "text_output",
        sampling,
        messages if _has(messages, "BYTES") else None,
        tuple(name for name in USAGE_OUTPUTS if _has(spec.output(name), INTEGER_TYPES)),
        _has(spec.output("finish_reason"), "BYTES"),
        spec.max_batch_size > 0,
        _has(messages, "BYTES") or bool(spec.parameters.get("chat_template")),
        _logprobs(spec),
        _logprobs(spec) is not None
        and _has(spec.input("prompt_logprobs"), "BOOL")
        and _has(spec.output("prompt_logprobs"), "BYTES"),
    )


def _logprobs(spec: ModelSpec) -> TensorSpec | None:
    """The input that asks for log probabilities: both halves or nothing (a model that takes the
    count and sends none back would leave the client's answer silently without them)."""
    top = spec.input("top_logprobs")
    return top if _has(top, INTEGER_TYPES) and _has(spec.output("logprobs"), "BYTES") else None


def _embedding(spec: ModelSpec) -> Offer | None:
    texts = [t for t in spec.inputs if t.datatype == "BYTES"]
    vectors = [t for t in spec.outputs if t.datatype == "FP32"]
    if len(texts) != 1 or not vectors or any(not t.optional for t in spec.inputs if t is not texts[0]):
        return None
    usage = ("prompt_tokens",) if _has(spec.output("prompt_tokens"), INTEGER_TYPES) else ()
    return Offer(
        spec.name, Kind.EMBEDDING, texts[0].name, vectors[0].name, {}, None, usage, False, spec.max_batch_size > 0
    )

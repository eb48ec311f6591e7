"""OpenAI requests as model inputs and model outputs as text, counts and vectors.

The model's tensors are named by its `Offer` (`catalog.py`); shapes follow its config
(a leading batch dimension of 1 when it batches, every other dimension 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from inference.types import InputTensor, OutputTensor, ParsedRequest
from services.gateway.openai.catalog import Offer
from services.gateway.openai.logprobs import Entry, parse_entries
from services.gateway.openai.openai_errors import refused
from services.gateway.openai.requests import GenerationRequest
from services.gateway.openai.routing_key import chat_blocks, text_blocks
from services.gateway.openai.templates import has_template, render_chat
from services.gateway.openai.tool_requests import Tools
from shared.config.datatypes import from_bytes, numpy_dtype, to_bytes
from shared.config.model_config import ModelSpec


def _input(spec: ModelSpec, name: str, datatype: str, value: object) -> InputTensor:
    tensor = spec.input(name)
    dims = [1 for _ in tensor.dims] if tensor is not None else [1]
    shape = ([1] if spec.max_batch_size > 0 else []) + dims
    array = np.array([value], dtype=np.object_ if datatype == "BYTES" else numpy_dtype(datatype)).reshape(shape)
    return InputTensor(name, datatype, shape, bytes(to_bytes(array, datatype)))


def generation_request(spec: ModelSpec, offer: Offer, request: GenerationRequest, request_id: str) -> ParsedRequest:
    """The model's inputs for a chat or completion request; a sampling parameter the model has no
    input for is refused (400), never dropped."""
    inputs = [_input(spec, "stream", "BOOL", request.stream)]
    tools = request.tools.tools if request.tools is not None else None
    if request.messages is not None and offer.messages is None:  # the front end applies the template
        if not has_template(spec):
            raise refused("messages", f"model '{offer.model}' has no chat template; use /v1/completions")
        inputs.append(_input(spec, offer.text_input, "BYTES", render_chat(spec, request.messages, tools).encode()))
    elif request.messages is not None and offer.messages is not None:
        inputs.append(_input(spec, offer.messages.name, "BYTES", orjson.dumps(request.messages)))
        text_input = spec.input(offer.text_input)
        if text_input is not None and not text_input.optional:
            inputs.append(_input(spec, offer.text_input, "BYTES", b""))
    else:
        inputs.append(_input(spec, offer.text_input, "BYTES", (request.prompt or "").encode()))
    if offer.adapter is not None:  # the model computes it with this LoRA adapter
        inputs.append(_input(spec, "lora_name", "BYTES", offer.adapter.encode()))
    sampling: dict[str, object] = dict(request.sampling)
    if request.logit_bias:  # {} asks nothing: any model serves it
        sampling["logit_bias"] = orjson.dumps({str(token): bias for token, bias in request.logit_bias.items()})
    if request.response_format is not None:  # text asks nothing
        sampling["response_format"] = orjson.dumps(request.response_format)
    if request.tools is not None:
        sampling.update(_tool_inputs(offer, request.tools))
    if request.logprobs is not None:
        if offer.logprobs is None:
            why = f"model '{offer.model}' has no 'top_logprobs' input with a 'logprobs' output"
            raise refused("logprobs", why)
        inputs.append(_input(spec, offer.logprobs.name, offer.logprobs.datatype, request.logprobs))
        if request.echo:  # OpenAI's answer starts with the prompt's tokens, scored
            if not offer.prompt_logprobs:
                why = f"model '{offer.model}' has no 'prompt_logprobs' input and output to score the prompt with"
                raise refused("echo", why + " ('echo' with 'logprobs')")
            inputs.append(_input(spec, "prompt_logprobs", "BOOL", True))
    for name, value in sampling.items():
        tensor = offer.sampling.get(name)
        if tensor is None:
            raise refused(name, f"model '{offer.model}' has no '{name}' input")
        inputs.append(_input(spec, tensor.name, tensor.datatype, value))
    return ParsedRequest(request_id, inputs, None, {}, _route(request, tools, offer.adapter))


def _route(request: GenerationRequest, tools: list[dict[str, Any]] | None, adapter: str | None) -> list[int]:
    """The prompt's prefix blocks, for the scheduler's prefix-aware routing (`routing_key.py`)."""
    if request.messages is not None:
        return chat_blocks(request.messages, tools, adapter)
    return text_blocks((request.prompt or "").encode(), adapter)


def _tool_inputs(offer: Offer, tools: Tools) -> dict[str, object]:
    """The model's inputs for tool calling: the tools always (a model that renders its own
    prompt must see them, and any model may call them; the example LLM guides a call it starts);
    `tool_choice` only when the model must call, which it enforces while decoding."""
    asked: dict[str, object] = {"tools": orjson.dumps(tools.tools)}
    if tools.choice != "auto":
        asked["tool_choice"] = orjson.dumps(tools.choice_document())
    if not tools.parallel and "parallel_tool_calls" in offer.sampling:  # else the front end keeps the first
        asked["parallel_tool_calls"] = False
    return asked


def embedding_request(spec: ModelSpec, offer: Offer, text: str, request_id: str) -> ParsedRequest:
    return ParsedRequest(request_id, [_input(spec, offer.text_input, "BYTES", text.encode())], None, {})


@dataclass
class Generated:
    """What one response of a generation model says."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprobs: list[Entry] | None = None  # None: the response has no `logprobs` output
    prompt_logprobs: list[Entry] | None = None  # the prompt's (the first response's, when asked)


def _output(outputs: list[OutputTensor], name: str) -> np.ndarray | None:
    for out in outputs:
        if out.name == name and out.data is not None:
            return from_bytes(out.data, out.datatype, out.shape).reshape(-1)
    return None


def _text(values: np.ndarray | None) -> str:
    if values is None or values.size == 0:
        return ""
    return b"".join(bytes(v) for v in values).decode("utf-8", errors="replace")


def generated(offer: Offer, outputs: list[OutputTensor]) -> Generated:
    piece = Generated(_text(_output(outputs, offer.output)))
    reason = _output(outputs, "finish_reason") if offer.finish_reason else None
    piece.finish_reason = _text(reason) or None
    piece.prompt_tokens = _count(outputs, "prompt_tokens") if "prompt_tokens" in offer.usage else None
    piece.completion_tokens = _count(outputs, "completion_tokens") if "completion_tokens" in offer.usage else None
    if offer.logprobs is not None:
        raw = _output(outputs, "logprobs")
        piece.logprobs = None if raw is None else parse_entries(b"".join(bytes(v) for v in raw), offer.model)
    if offer.prompt_logprobs:
        raw = _output(outputs, "prompt_logprobs")
        if raw is not None:
            piece.prompt_logprobs = parse_entries(b"".join(bytes(v) for v in raw), offer.model, prompt=True)
    return piece


def _count(outputs: list[OutputTensor], name: str) -> int | None:
    values = _output(outputs, name)
    return int(values[0]) if values is not None and values.size > 0 else None


def embedding(offer: Offer, outputs: list[OutputTensor]) -> tuple[np.ndarray, int]:
    """The vector (FP32, flattened) and the prompt's token count (0 when the model gives none)."""
    vector = _output(outputs, offer.output)
    if vector is None:
        raise ValueError(f"model '{offer.model}' sent no '{offer.output}' output")
    tokens = _count(outputs, "prompt_tokens") if offer.usage else None
    return vector.astype(np.float32, copy=False), tokens or 0

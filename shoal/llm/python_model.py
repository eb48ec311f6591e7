"""A Triton python-backend model that serves a GGUF language model with continuous batching.

A `model.py` subclasses it (the example `smollm2-135m-instruct` is two lines:
services/repository/llm_examples.py). The model is decoupled: `execute` hands each request to
the engine (`engine.py`) and returns once it has joined the running sequences; the engine's
thread sends one response per token through the request's response sender, and the final one
with `finish_reason` and the usage counts. Its config says, as string parameters:

| parameter | default | |
|---|---|---|
| `gguf` | (required) | the model file: `package/file.gguf` inside an installed package, or a path (relative: to the version folder) |
| `quantization` | the file's | a llama.cpp type to requantize the file to at load (`Q8_0`, `IQ4_NL`, ...; `requantize.py`), made once into a cache (none can be kept: the file as it is, with a warning) |
| `max_sequences` | 8 | sequences decoding together |
| `n_ctx` | 8192 | KV cells shared by those sequences (the context memory bound) |
| `max_sequence_tokens` | 2048 | the most one sequence may hold, prompt and completion |
| `n_batch` | 512 | the most tokens one decode step takes |
| `prefix_cache_tokens` | 512 | KV cells kept for the latest prompts' starts, which a newcomer's prompt that starts the same way shares |
| `prefix_cache_entries` | 1 | prompts kept (a conversation's next turn starts with its previous prompt: with several conversations on an instance, one each) |
| `n_threads` | 1 | llama.cpp's threads for one sequence's token |
| `n_threads_batch` | `n_threads` | its threads for a batch of several tokens (sequences together, prompts) |
| `llama_cpu_backends` | llama-cpp-python's `lib/` | folders searched for a portable build's CPU backends (`libggml-cpu-*.so`), `:`-separated |
| `lora_adapters` | none | LoRA adapters on this model, as JSON: `{"name": "file.gguf"}` (each file as `gguf`'s), loaded once beside the one copy of the base weights |
| `REPORT_CUSTOM_METRICS` | `true` | its token, time-per-token and KV-cache metrics (llm_metrics.py; the vLLM backend's parameter, on here by default) |

Inputs: `text_input` or `messages` (a JSON conversation, rendered with the GGUF's own chat
template), `stream`, and optionally `max_tokens`, `temperature`, `top_p`, `seed`, `frequency_penalty`,
`presence_penalty`, `logit_bias` and `response_format` (both JSON), `top_logprobs` (asks for each
token's log probability and this many most likely alternatives, 0 to 20), `prompt_logprobs`
(true, with `top_logprobs`: the prompt's tokens' too, for OpenAI's `echo`), `tools` (OpenAI's tools
as JSON: rendered into the prompt), `tool_choice` (JSON, "required" or a named function: the
output is forced to calls by a grammar, `tool_grammar.py`; absent or "auto": a call the model
starts is held to the same grammar from its opening on) and `parallel_tool_calls` (false:
one call), `lora_name` (one of `lora_adapters`: that adapter computes the answer; absent or
empty: the base model). Outputs:
`text_output`, `finish_reason`, `prompt_tokens`, `completion_tokens`, and `logprobs` when asked
(JSON, OpenAI's chat shape: one object per token of the response; docs/openai.md), and
`prompt_logprobs` when asked (the same shape for the prompt's tokens, the first one's `logprob`
null; on the first response only).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shared.config.lora_adapters import lora_adapters
from shoal.llm import probe
from shoal.llm.engine import Engine, Job, Limits
from shoal.llm.llama_c_api import ContextSettings, LazyGrammar, Library, LlamaModel, library_folder
from shoal.llm.llm_metrics import LlmMetrics
from shoal.llm.requantize import CacheUnavailable, requantized
from shoal.llm.text import render_chat
from shoal.llm.token_logprobs import MAX_TOP, Logprob, to_json
from shoal.llm.tool_grammar import request_grammar

log = logging.getLogger("shoal.llm")


def gguf_path(setting: str, version_folder: Path) -> Path:
    """`package/file.gguf` inside an installed package, or a file path."""
    head, _, rest = setting.partition("/")
    spec = importlib.util.find_spec(head) if rest and head.isidentifier() else None
    if spec is not None and spec.submodule_search_locations:
        return Path(spec.submodule_search_locations[0]) / rest
    path = Path(setting)
    return path if path.is_absolute() else version_folder / path


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    return path


def _requantized(gguf: Path, kind: str, library: Library, threads: int) -> Path:
    """The cached copy in `kind`; the file as it is, with a warning, where no copy can be kept (a
    read-only home): the model still serves, only slower. A type llama.cpp cannot make fails."""
    try:
        return requantized(gguf, kind, library, threads)
    except CacheUnavailable as exc:
        log.warning("%s: serving it unrequantized: %s", gguf.name, exc)
        return gguf


def _scalar(request: Any, name: str, default: Any) -> Any:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class _Responses:
    """One request's response sender as the engine's `Sink`: a response per piece of text when
    streaming, else one at the end."""

    def __init__(self, sender: Any, stream: bool, prompt_tokens: int, logprobs: bool = False) -> None:
        self.sender, self.stream, self.prompt_tokens = sender, stream, prompt_tokens
        self.logprobs = logprobs  # asked: every response carries its tokens' (none asked: no output)
        self.held: list[str] = []
        self.held_logprobs: list[Logprob] = []
        self.prompt_logprobs: list[Logprob] | None = None  # the prompt's, until a response carries them

    def text(self, text: str, completion_tokens: int, logprobs: Sequence[Logprob] = ()) -> None:
        if self.stream:
            self.sender.send(self._response(text, "", completion_tokens, logprobs))
        else:
            self.held.append(text)
            self.held_logprobs.extend(logprobs)

    def end(self, text: str, reason: str, completion_tokens: int, logprobs: Sequence[Logprob] = ()) -> None:
        import triton_python_backend_utils as pb_utils

        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if reason == "cancelled":  # nobody listens: just close the stream
            self.sender.send(flags=final)
            return
        entries = [*self.held_logprobs, *logprobs]
        response = self._response("".join(self.held) + text, reason, completion_tokens, entries)
        self.sender.send(response, flags=final)

    def prompt(self, logprobs: Sequence[Logprob]) -> None:
        self.prompt_logprobs = list(logprobs)

    def fail(self, message: str) -> None:
        import triton_python_backend_utils as pb_utils

        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())

    def _response(self, text: str, reason: str, completion_tokens: int, logprobs: Sequence[Logprob]) -> Any:
        import triton_python_backend_utils as pb_utils

        outputs = [
            pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
            pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
            pb_utils.Tensor("prompt_tokens", np.array([self.prompt_tokens], np.int32)),
            pb_utils.Tensor("completion_tokens", np.array([completion_tokens], np.int32)),
        ]
        if self.logprobs:
            entries = json.dumps(to_json(list(logprobs))).encode()
            outputs.append(pb_utils.Tensor("logprobs", np.array([entries], dtype=np.object_)))
        if self.prompt_logprobs is not None:  # the first response after the prompt went in
            entries = json.dumps(to_json(self.prompt_logprobs)).encode()
            outputs.append(pb_utils.Tensor("prompt_logprobs", np.array([entries], dtype=np.object_)))
            self.prompt_logprobs = None
        return pb_utils.InferenceResponse(output_tensors=outputs)


class LlamaPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        settings = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
        if "gguf" not in settings:
            raise ValueError("the config has no 'gguf' parameter (the model file)")
        version_folder = Path(args["model_repository"]) / args["model_version"]
        gguf = _existing(gguf_path(settings["gguf"], version_folder))

        def number(key: str, default: int) -> int:
            return int(settings.get(key) or default)

        folders = (
            [Path(f) for f in settings["llama_cpu_backends"].split(":")]
            if settings.get("llama_cpu_backends")
            else [library_folder()]
        )
        # in a child first: a library that dies on this CPU fails the load here, with the reason
        choice = probe.choose(gguf, folders)
        library = Library.start(choice.variant)
        if settings.get("quantization"):  # a type the file does not ship: a cached copy (requantize.py)
            gguf = _requantized(gguf, settings["quantization"], library, number("n_threads", 1))
        context = ContextSettings(
            n_ctx=number("n_ctx", 8192),
            max_sequences=number("max_sequences", 8),
            n_batch=number("n_batch", 512),
            n_threads=number("n_threads", 1),
            n_threads_batch=number("n_threads_batch", number("n_threads", 1)),
            cache_entries=max(1, number("prefix_cache_entries", 1)),
        )
        self.model = LlamaModel(gguf, context, library)
        # before the engine's thread starts: a file llama.cpp refuses fails the load, saying why,
        # and frees the base model (a failed initialize gets no finalize)
        try:
            self.adapters = {
                name: self.model.load_adapter(_existing(gguf_path(path, version_folder)))
                for name, path in lora_adapters(settings).items()
            }
        except BaseException:
            self.model.close()
            raise
        self.engine = Engine(
            self.model,
            Limits(
                context.max_sequences,
                context.n_batch,
                number("max_sequence_tokens", 2048),
                number("prefix_cache_tokens", 512),
                context.cache_entries,
            ),
            _meter(args, settings),
        )
        self.template = self.model.chat_template()
        self.bos, self.eos = self.model.special_text("bos"), self.model.special_text("eos")
        self._lock = threading.Lock()
        backend = choice.variant.name if choice.variant else "built in"
        log.info(
            "%s: llama.cpp (CPU backend %s: %s), %d sequences, %d KV cells, LoRA adapters %s",
            args.get("model_name", gguf.name),
            backend,
            choice.system_info,
            context.max_sequences,
            self.model.n_ctx,
            sorted(self.adapters) or "none",
        )

    def execute(self, requests: list[Any]) -> None:
        import triton_python_backend_utils as pb_utils

        for request in requests:
            sender = request.get_response_sender()
            try:
                self.engine.submit(self._job(request, sender))
            except Exception as exc:  # a prompt that can never run, a template that refuses it
                error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INVALID_ARG)
                sender.send(
                    pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        return None

    def _prompt(self, request: Any) -> list[int]:
        import triton_python_backend_utils as pb_utils

        messages = pb_utils.get_input_tensor_by_name(request, "messages")
        if messages is not None:
            if not self.template:
                raise ValueError("the model has no chat template")
            chat = json.loads(messages.as_numpy().reshape(-1)[0])
            tools = _json_input(request, "tools")
            return self.model.tokenize(render_chat(self.template, chat, self.bos, self.eos, tools))
        text = _scalar(request, "text_input", b"")
        return self.model.tokenize(text.decode() if isinstance(text, bytes) else str(text), add_special=True)

    def _job(self, request: Any, sender: Any) -> Job:
        with self._lock:  # tokenizing reads the model's vocabulary: one caller at a time
            prompt = self._prompt(request)
        seed = _scalar(request, "seed", None)
        max_tokens = _scalar(request, "max_tokens", None)
        top = _scalar(request, "top_logprobs", None)
        if top is not None and not 0 <= int(top) <= MAX_TOP:
            raise ValueError(f"top_logprobs is {int(top)}, not from 0 to {MAX_TOP}")
        return Job(
            prompt,
            _Responses(sender, bool(_scalar(request, "stream", True)), len(prompt), top is not None),
            max_tokens=None if max_tokens is None else int(max_tokens),
            temperature=float(_scalar(request, "temperature", 0.8)),
            top_p=float(_scalar(request, "top_p", 0.95)),
            seed=None if seed is None else int(seed),
            frequency_penalty=float(_scalar(request, "frequency_penalty", 0.0)),
            presence_penalty=float(_scalar(request, "presence_penalty", 0.0)),
            logit_bias=self._logit_bias(_scalar(request, "logit_bias", None)),
            grammar=_grammar(request),
            logprobs=None if top is None else int(top),
            prompt_logprobs=bool(_scalar(request, "prompt_logprobs", False)),
            adapter=self._adapter(_scalar(request, "lora_name", b"")),
        )

    def _adapter(self, name: Any) -> int | None:
        """The engine's index of the adapter `name` (empty: None, the base model); unknown: 400."""
        name = name.decode() if isinstance(name, bytes) else str(name)
        if not name:
            return None
        if name not in self.adapters:
            known = ", ".join(sorted(self.adapters)) or "none"
            raise ValueError(f"Unknown LoRA: {name}; the model's adapters: {known}")
        return self.adapters[name]

    def _logit_bias(self, given: Any) -> dict[int, float]:
        """{"<token id>": bias} as JSON; a token id this model's vocabulary lacks is refused (400)."""
        if given is None:
            return {}
        biases = {int(token): float(bias) for token, bias in json.loads(given).items()}
        unknown = sorted(token for token in biases if not 0 <= token < self.model.n_vocab)
        if unknown:
            raise ValueError(f"logit_bias names token {unknown[0]}, not in the model's {self.model.n_vocab} tokens")
        return biases

    def finalize(self) -> None:
        self.engine.close()
        self.model.close()


def _meter(args: dict[str, str], settings: dict[str, str]) -> LlmMetrics | None:
    if settings.get("REPORT_CUSTOM_METRICS", "true").strip().lower() in ("false", "no", "off", "0"):
        return None
    import triton_python_backend_utils as pb_utils

    labels = {"model": args.get("model_name", ""), "version": args.get("model_version", "")}
    return LlmMetrics(pb_utils, labels, args.get("model_instance_name", ""))


def _json_input(request: Any, name: str) -> Any:
    given = _scalar(request, name, None)
    return None if given is None else json.loads(given)


def _grammar(request: Any) -> str | LazyGrammar:
    """The grammar of the tool calls `tool_choice` asks for, or of `response_format` (tool_grammar.py)."""
    choice, tools = _json_input(request, "tool_choice"), _json_input(request, "tools")
    parallel = bool(_scalar(request, "parallel_tool_calls", True))
    return request_grammar(tools, choice, parallel, _scalar(request, "response_format", None))

"""OpenAI request bodies, checked: what a request asks for, or OpenAI's 400 saying why not.

Pure functions of the JSON body. A parameter Shoal cannot honour (`suffix`, `audio`, ...) is
refused, never ignored; an argument OpenAI's API
does not know is refused with OpenAI's own text (docs/openai.md, "Parameters").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from services.gateway.openai.openai_errors import OpenAIError, invalid_value, refused
from services.gateway.openai.tool_requests import Tools, parse_tools, tool_turn

# accepted and without effect on the answer (bookkeeping on OpenAI's side)
_HARMLESS = frozenset({"user", "metadata", "store", "service_tier"})
_SAMPLING = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
_COMMON = frozenset({"model", "stream", "stream_options", "max_tokens", "stop", "n", "logit_bias", *_SAMPLING})
# parameter -> the values that mean "not asked for" (then it is accepted)
_REFUSED_CHAT: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
_REFUSED_COMPLETION: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "suffix": (None, ""),
}
MAX_CHOICES = 128  # OpenAI's own bound on `n`
MAX_TOP_LOGPROBS = {True: 20, False: 5}  # OpenAI's bounds: chat's top_logprobs, completions' logprobs
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass
class GenerationRequest:
    """A chat or completion request: exactly one of `prompt` and `messages` is set."""

    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None  # role and content (a string), tool calls and results
    stream: bool = False
    include_usage: bool = False
    sampling: dict[str, int | float] = field(default_factory=dict)  # max_tokens, temperature, top_p, seed
    stop: list[str] = field(default_factory=list)
    echo: bool = False  # completions: the prompt comes back before the completion's text
    n: int = 1  # choices: one generation each
    response_format: dict[str, Any] | None = None  # chat: json_object or json_schema (None: text)
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: int | None = None  # each token's log probability and this many likeliest (None: not asked)
    tools: Tools | None = None  # chat: the functions the model may call (None: none)


@dataclass
class EmbeddingRequest:
    model: str
    texts: list[str]
    base64: bool


def parse_chat(body: Any) -> GenerationRequest:
    doc = _object(body)
    known = _COMMON | {"messages", "max_completion_tokens", "response_format", "logprobs", "top_logprobs"}
    _refuse(doc, _REFUSED_CHAT, known | {"tools", "tool_choice", "parallel_tool_calls"})
    request = _generation(doc)
    request.messages = _messages(doc.get("messages"))
    request.response_format = _response_format(doc.get("response_format"))
    request.logprobs = _chat_logprobs(doc.get("logprobs"), doc.get("top_logprobs"))
    request.tools = parse_tools(doc)
    if request.tools is not None and request.response_format is not None:  # both would need a grammar
        raise refused("response_format", "with 'tools': a reply is either a call or the formatted content")
    return request


def parse_completion(body: Any) -> GenerationRequest:
    doc = _object(body)
    _refuse(doc, _REFUSED_COMPLETION, _COMMON | {"prompt", "echo", "logprobs"})
    # with echo, max_tokens 0 asks for the prompt alone (with logprobs: scored), as OpenAI's
    scoring = doc.get("echo") is True and _is_int(doc.get("max_tokens")) and doc.get("max_tokens") == 0
    request = _generation({**doc, "max_tokens": None} if scoring else doc)
    if scoring:
        request.sampling["max_tokens"] = 0
    request.prompt = _prompt(doc.get("prompt"))
    echo = doc.get("echo", False)
    if not isinstance(echo, bool) and echo is not None:
        raise invalid_value("echo", "expected a boolean")
    request.echo = bool(echo)
    request.logprobs = _count(doc.get("logprobs"), "logprobs", MAX_TOP_LOGPROBS[False])
    return request


def parse_embedding(body: Any) -> EmbeddingRequest:
    doc = _object(body)
    _refuse(doc, {"dimensions": (None,)}, frozenset({"model", "input", "encoding_format"}))
    texts = doc.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise invalid_value(
            "input", "expected a string or a non-empty list of strings (token arrays are not supported)"
        )
    encoding = doc.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise invalid_value("encoding_format", f"'{encoding}' is not one of 'float', 'base64'")
    return EmbeddingRequest(_model(doc), texts, encoding == "base64")


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object", 400)
    return body


def _model(doc: dict[str, Any]) -> str:
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("you must provide a model parameter", 400, param="model")
    return model


def _refuse(doc: dict[str, Any], refused_values: dict[str, tuple[Any, ...]], known: frozenset[str]) -> None:
    for key, value in doc.items():
        if key in refused_values:
            if not any(value == allowed and type(value) is type(allowed) for allowed in refused_values[key]):
                raise refused(key, "Shoal's OpenAI front end does not implement it")
        elif key not in known and key not in _HARMLESS:
            raise OpenAIError(f"Unrecognized request argument supplied: {key}", 400, param=key)


def _generation(doc: dict[str, Any]) -> GenerationRequest:
    stream = doc.get("stream") or False
    if not isinstance(stream, bool):
        raise invalid_value("stream", "expected a boolean")
    n = doc.get("n")
    if n is not None and (not _is_int(n) or not 1 <= n <= MAX_CHOICES):
        raise invalid_value("n", f"expected an integer from 1 to {MAX_CHOICES}")
    request = GenerationRequest(_model(doc), stream=stream, include_usage=_include_usage(doc, stream))
    request.n = n or 1
    request.sampling = _sampling(doc)
    request.stop = _stop(doc.get("stop"))
    request.logit_bias = _logit_bias(doc.get("logit_bias"))
    return request


def _include_usage(doc: dict[str, Any], stream: bool) -> bool:
    options = doc.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid_value("stream_options", "only allowed when 'stream' is true")
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise invalid_value("stream_options", "expected an object with a boolean 'include_usage'")
    return bool(options.get("include_usage", False))


def _sampling(doc: dict[str, Any]) -> dict[str, int | float]:
    sampling: dict[str, int | float] = {}
    limit = doc.get("max_completion_tokens", doc.get("max_tokens"))
    if limit is not None:
        if not _is_int(limit) or limit < 1:
            raise invalid_value("max_tokens", "expected an integer of at least 1")
        sampling["max_tokens"] = limit
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = doc.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise invalid_value(name, f"expected a number from {low:g} to {high:g}")
        sampling[name] = float(value)
    for name in ("frequency_penalty", "presence_penalty"):
        value = doc.get(name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not -2.0 <= value <= 2.0:
            raise invalid_value(name, "expected a number from -2 to 2")
        if value:  # 0 is no penalty: asked of any model, with or without the input
            sampling[name] = float(value)
    seed = doc.get("seed")
    if seed is not None:
        if not _is_int(seed):
            raise invalid_value("seed", "expected an integer")
        sampling["seed"] = seed
    return sampling


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's `logit_bias`: token ids (JSON keys, so strings) to a bias from -100 to 100."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_value("logit_bias", "expected an object of token ids to numbers")
    biases: dict[int, float] = {}
    for key, bias in value.items():
        token = str(key)
        if not token.isdigit() or isinstance(bias, bool) or not isinstance(bias, (int, float)) or abs(bias) > 100:
            raise invalid_value("logit_bias", f"expected token ids to numbers from -100 to 100, got {key!r}: {bias!r}")
        biases[int(token)] = float(bias)
    return biases


def _chat_logprobs(logprobs: Any, top: Any) -> int | None:
    """Chat's `logprobs` (a boolean) and `top_logprobs` (0 to 20, only with `logprobs` true) as
    the count of likeliest tokens to report, None when not asked."""
    if logprobs is not None and not isinstance(logprobs, bool):
        raise invalid_value("logprobs", "expected a boolean")
    count = _count(top, "top_logprobs", MAX_TOP_LOGPROBS[True])
    if not logprobs:
        if count:
            raise invalid_value("top_logprobs", "'logprobs' must be true when 'top_logprobs' is used")
        return None
    return count or 0


def _count(value: Any, name: str, high: int) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= high:
        raise invalid_value(name, f"expected an integer from 0 to {high}")
    return int(value)


def _response_format(value: Any) -> dict[str, Any] | None:
    """OpenAI's `response_format`: text (None), `json_object`, or `json_schema` with a schema object."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": kind}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("name"), str)
            or not isinstance(spec.get("schema"), dict)
        ):
            raise invalid_value("response_format", "json_schema needs a 'name' and a 'schema' object")
        return {"type": kind, "json_schema": spec}
    raise invalid_value("response_format", "expected a type of 'text', 'json_object' or 'json_schema'")


def choice_with_seed(request: GenerationRequest, index: int) -> GenerationRequest:
    """The request for choice `index` of `n`: its seed moved by the index, so that each choice is
    its own draw and the whole answer still repeats with the same seed."""
    sampling = {**request.sampling, "seed": int(request.sampling["seed"]) + index}
    return replace(request, sampling=sampling)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise invalid_value("stop", "expected a non-empty string or a list of up to 4 non-empty strings")
    return stops


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise invalid_value("prompt", "expected a string (one prompt; token arrays are not supported)")
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid_value("messages", "expected a non-empty list of messages")
    return [_message(m, i) for i, m in enumerate(value)]


def _message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise invalid_value(where, f"expected an object with a 'role' among {sorted(ROLES)}")
    tooling = tool_turn(message, where)
    content = message.get("content")
    if content is None and tooling.get("tool_calls"):  # an assistant's turn that only calls
        content = ""
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise refused(where + ".content", "only text content parts are supported")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise invalid_value(where + ".content", "expected a string or a list of text parts")
    return {"role": message["role"], "content": content, **tooling}

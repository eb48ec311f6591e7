"""The JSON documents of OpenAI's API: completions, chunks, embeddings, model lists.

Pure functions; field names and `object` values as the official `openai` client reads them.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import numpy as np

from services.gateway.openai import logprobs
from services.gateway.openai.catalog import Kind, Offer
from services.gateway.openai.logprobs import Placed
from services.gateway.openai.tool_calls import CallDelta


class Reply:
    """The fixed fields of one chat or completion answer (its id, time, model and kind)."""

    def __init__(self, model: str, chat: bool, logprobs: bool = False) -> None:
        self.chat = chat
        self.logprobs = logprobs  # asked: every choice carries them
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}

    def whole(
        self, texts: list[tuple[str, str, list[Placed], list[dict[str, Any]]]], usage: dict[str, int]
    ) -> dict[str, Any]:
        """The answer of a request with `stream` false: each choice's text, finish reason,
        tokens' log probabilities and tool calls."""
        choices = []
        for index, (text, finish_reason, placed, calls) in enumerate(texts):
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if calls:  # OpenAI's shape: content null when the turn only calls
                    message.update(content=text or None, tool_calls=calls)
                choice: dict[str, Any] = {"index": index, "message": message}
            else:
                choice = {"index": index, "text": text}
            choice.update(finish_reason=finish_reason, logprobs=self._logprobs(placed) if self.logprobs else None)
            choices.append(choice)
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": choices, "usage": usage}

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None,
        with_usage: bool,
        first: bool = False,
        index: int = 0,
        placed: list[Placed] | None = None,
        calls: list[CallDelta] | None = None,
    ) -> dict[str, Any]:
        """One streamed chunk; the first of a chat carries the role, the last the finish reason,
        and each the log probabilities of the tokens its text starts (when asked) and the
        pieces of tool calls read in it."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = [call.document() for call in calls]
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or ""}
        choice.update(finish_reason=finish_reason, logprobs=self._logprobs(placed) if placed else None)
        doc = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if with_usage:  # stream_options.include_usage: every chunk says null, the last one counts
            doc["usage"] = None
        return doc

    def _logprobs(self, placed: list[Placed]) -> dict[str, Any]:
        return logprobs.chat(placed) if self.chat else logprobs.completion(placed)

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {
            **self._head("chat.completion.chunk" if self.chat else "text_completion"),
            "choices": [],
            "usage": usage,
        }


def embeddings(model: str, vectors: list[np.ndarray], as_base64: bool, prompt_tokens: int) -> dict[str, Any]:
    data = [
        {
            "object": "embedding",
            "index": i,
            # base64: the float32 values' little-endian bytes, as OpenAI's API sends them
            "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def model_entry(offer: Offer, created: int) -> dict[str, Any]:
    return {"id": offer.model, "object": "model", "created": created, "owned_by": "shoal", "shoal_api": _api(offer)}


def _api(offer: Offer) -> list[str]:
    if offer.kind == Kind.EMBEDDING:
        return ["embeddings"]
    return ["chat.completions", "completions"] if offer.chat else ["completions"]


def model_list(offers: list[Offer], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_entry(o, created) for o in offers]}

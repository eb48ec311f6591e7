"""One chat or completion request through the inference core: text pieces as the model makes
them, stop sequences applied, usage counted.

Leaving the iteration early (a stop sequence, a client gone) closes the core's stream, which
cancels the request: it leaves its queue, or the running model sees `is_cancelled()`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass

from inference.core import InferenceCore
from inference.types import ParsedRequest
from services.gateway.openai.catalog import Offer
from services.gateway.openai.stops import StopScanner
from services.gateway.openai.tensors import generated
from shared.config.model_config import ModelSpec
from shared.errors import ShoalError


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def document(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}


@dataclass
class Piece:
    text: str
    finish_reason: str | None = None  # set on the last piece only


class Generation:
    """Iterate for the pieces; `usage` is complete once the iteration ends."""

    def __init__(
        self, core: InferenceCore, spec: ModelSpec, version: int, offer: Offer, parsed: ParsedRequest, stops: list[str]
    ) -> None:
        self.core, self.spec, self.version, self.offer, self.parsed = core, spec, version, offer, parsed
        self.scanner = StopScanner(stops)
        self.usage = Usage()
        self._responses = 0  # responses with text: the completion's length when the model counts none

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        stream = self.core.stream(self.spec, self.version, self.parsed)
        reason = None
        try:
            async for item in stream:
                if isinstance(item, ShoalError):  # the model failed: the rest of the answer is lost
                    raise item
                piece = generated(self.offer, item.outputs)
                self._count(piece.text, piece.prompt_tokens, piece.completion_tokens)
                shown = self.scanner.feed(piece.text)
                if self.scanner.stopped:
                    yield Piece(shown, "stop")
                    return
                reason = piece.finish_reason or reason
                if shown:
                    yield Piece(shown)
        finally:
            await stream.aclose()
        yield Piece(self.scanner.flush(), reason or "stop")

    def _count(self, text: str, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        self._responses += 1 if text else 0
        if prompt_tokens is not None:
            self.usage.prompt_tokens = prompt_tokens
        self.usage.completion_tokens = completion_tokens if completion_tokens is not None else self._responses

"""One chat or completion request through the inference core: text pieces as the model makes
them, stop sequences applied, usage counted. A completion's echoed prompt is its first piece:
with `logprobs`, once the model's first response brings the prompt's tokens' entries.

Leaving the iteration early (a stop sequence, a client gone) closes the core's stream, which
cancels the request: it leaves its queue, or the running model sees `is_cancelled()`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from inference.core import InferenceCore
from inference.types import ParsedRequest
from services.gateway.openai.catalog import Offer
from services.gateway.openai.logprobs import Aligner, Entry, Placed, missing, place_all
from services.gateway.openai.stops import StopScanner
from services.gateway.openai.tensors import generated
from services.gateway.openai.tool_calls import CallDelta, ToolParser
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
    logprobs: list[Placed] = field(default_factory=list)  # the tokens whose text starts in this piece
    tool_calls: list[CallDelta] = field(default_factory=list)  # calls' pieces read out of the text


class Generation:
    """Iterate for the pieces; `usage` is complete once the iteration ends."""

    def __init__(
        self,
        core: InferenceCore,
        spec: ModelSpec,
        version: int,
        offer: Offer,
        parsed: ParsedRequest,
        stops: list[str],
        logprobs: bool = False,
        calls: ToolParser | None = None,
        echo: str | None = None,
    ) -> None:
        self.core, self.spec, self.version, self.offer, self.parsed = core, spec, version, offer, parsed
        self.scanner = StopScanner(stops)
        self.echo = echo  # the prompt, to come back before the completion (None: not asked)
        start = len(echo or "")  # the generated text's offsets start after the echo
        self.aligner = Aligner(start) if logprobs else None  # asked: every response must carry them
        self.calls = calls  # tools were given: calls are read out of the text
        self._shown = start  # characters of text handed out
        self.usage = Usage()
        self._responses = 0  # responses with text: the completion's length when the model counts none

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        stream = self.core.stream(self.spec, self.version, self.parsed)
        reason = None
        echo = self.echo  # shown once the model answers: an error before it stays a plain error
        try:
            async for item in stream:
                if isinstance(item, ShoalError):  # the model failed: the rest of the answer is lost
                    raise item
                piece = generated(self.offer, item.outputs)
                if echo is not None:
                    yield self._echoed(echo, piece.prompt_logprobs)
                    echo = None
                self._count(piece.text, piece.prompt_tokens, piece.completion_tokens)
                if self.aligner is not None and item.outputs:
                    if piece.logprobs is None:
                        raise missing(self.offer.model)
                    self.aligner.feed(piece.logprobs)
                shown = self.scanner.feed(piece.text)
                if self.scanner.stopped:  # the tokens after the stop go with their text
                    yield self._piece(shown, "stop", self._released(shown))
                    return
                reason = piece.finish_reason or reason
                out = self._piece(shown, None, self._released(shown))
                if out.text or out.logprobs or out.tool_calls:
                    yield out
        finally:
            await stream.aclose()
        if echo is not None:  # the model sent nothing
            yield Piece(echo)
        rest = self.scanner.flush()
        yield self._piece(rest, reason or "stop", self.aligner.rest() if self.aligner is not None else [])

    def _echoed(self, echo: str, entries: list[Entry] | None) -> Piece:
        """The echoed prompt, with its tokens' entries (from the model's first response) when asked."""
        if self.aligner is None:
            return Piece(echo)
        if entries is None:
            raise missing(self.offer.model, "prompt_logprobs")
        return Piece(echo, None, place_all(entries))

    def _piece(self, shown: str, reason: str | None, released: list[Placed]) -> Piece:
        """The piece with its calls read out (the last one, with a reason, flushes the parser)."""
        if self.calls is None:
            return Piece(shown, reason, released)
        text, deltas = self.calls.feed(shown)
        if reason is not None:
            rest, more = self.calls.flush()
            text, deltas = text + rest, deltas + more
            reason = "tool_calls" if self.calls.count and reason == "stop" else reason
        return Piece(text, reason, released, deltas)

    def _released(self, shown: str) -> list[Placed]:
        self._shown += len(shown)
        return self.aligner.shown(self._shown) if self.aligner is not None else []

    def _count(self, text: str, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        self._responses += 1 if text else 0
        if prompt_tokens is not None:
            self.usage.prompt_tokens = prompt_tokens
        self.usage.completion_tokens = completion_tokens if completion_tokens is not None else self._responses

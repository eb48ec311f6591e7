"""The `n` choices of one chat or completion request (OpenAI's `n`): one generation each, run
together as separate model requests (the model batches them like any others), their pieces
merged in the order they arrive, each tagged with its choice's index."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from services.gateway.openai.generation import Generation, Piece, Usage
from services.gateway.openai.logprobs import Placed
from services.gateway.openai.tool_calls import whole_calls

# one choice's text, finish reason, tokens' log probabilities and tool calls
Answer = tuple[str, str, list[Placed], list[dict[str, Any]]]

_DONE = object()


class Choices:
    def __init__(self, generations: list[Generation]) -> None:
        self.generations = generations

    def usage(self) -> Usage:
        """One prompt, every choice's completion (complete once the pieces have ended)."""
        first = self.generations[0].usage
        return Usage(first.prompt_tokens, sum(g.usage.completion_tokens for g in self.generations))

    async def whole(self) -> list[Answer]:
        """Each choice's text, finish reason and log probabilities (when asked), in index order."""
        return list(await asyncio.gather(*(_collect(g) for g in self.generations)))

    async def pieces(self) -> AsyncGenerator[tuple[int, Piece], None]:
        """(choice index, piece) as they come; the first failure ends them all."""
        if len(self.generations) == 1:  # the common case: no tasks, no queue
            async for piece in self.generations[0].pieces():
                yield 0, piece
            return
        queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        tasks = [asyncio.create_task(_pump(i, g, queue)) for i, g in enumerate(self.generations)]
        try:
            running = len(tasks)
            while running:
                index, item = await queue.get()
                if item is _DONE:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    assert isinstance(item, Piece)
                    yield index, item
        finally:
            for task in tasks:
                task.cancel()  # a client gone or a failed choice: the others' requests end too


async def _collect(generation: Generation) -> Answer:
    text, reason, logprobs, calls = [], "stop", [], []
    async for piece in generation.pieces():
        text.append(piece.text)
        reason = piece.finish_reason or reason
        logprobs.extend(piece.logprobs)
        calls.extend(piece.tool_calls)
    return "".join(text), reason, logprobs, whole_calls(calls)


async def _pump(index: int, generation: Generation, queue: asyncio.Queue[tuple[int, object]]) -> None:
    try:
        async for piece in generation.pieces():
            queue.put_nowait((index, piece))
    except Exception as exc:  # handed to the reader, which raises it
        queue.put_nowait((index, exc))
    queue.put_nowait((index, _DONE))

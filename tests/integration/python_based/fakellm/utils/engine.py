"""A stand-in for vLLM's AsyncLLMEngine: an asyncio engine that "generates" the prompt's words in
upper case, one token per step, so that the backend above it has the shape of vLLM's."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass
class RequestOutput:
    request_id: str
    text: str
    token_count: int
    finished: bool


class Engine:
    def __init__(self, step_delay_s: float, healthy: bool) -> None:
        self.step_delay_s = step_delay_s
        self.healthy = healthy
        self.aborted: set[str] = set()

    async def generate(self, prompt: str, request_id: str, max_tokens: int):
        words = prompt.split() or [""]
        tokens = [words[i % len(words)].upper() for i in range(max_tokens)]
        for count in range(1, len(tokens) + 1):
            await asyncio.sleep(self.step_delay_s)
            if request_id in self.aborted:
                return
            yield RequestOutput(request_id, " ".join(tokens[:count]), count, count == len(tokens))

    async def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    async def check_health(self) -> None:
        if not self.healthy:
            raise RuntimeError("the engine is not healthy")


@contextlib.asynccontextmanager
async def build_engine(step_delay_s: float, healthy: bool = True):
    yield Engine(step_delay_s, healthy)

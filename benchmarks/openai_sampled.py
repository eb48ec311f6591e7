"""Sampled answers of the example LLM for the benchmarks that check each one (structured output,
tool calls): `shoal serve --openai-port` on a scratch directory and free ports, `requests`
requests through the official `openai` client, `concurrency` at a time, each asked by `ask`."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import openai

from benchmarks.openai_stream import start_shoal

T = TypeVar("T")
Ask = Callable[[openai.AsyncOpenAI, int, int], Awaitable[T]]  # (client, seed, max_tokens) -> an answer


def arguments(description: str | None, requests: int, max_tokens: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=max_tokens)
    return parser.parse_args()


def sample(ask: Ask[T], args: argparse.Namespace) -> tuple[list[T], float]:
    """Every answer, in seed order, and the seconds they took together."""
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as workdir:
        process, port = start_shoal(Path(workdir))
        try:
            started = time.perf_counter()
            answers = asyncio.run(_asked(ask, port, args.requests, args.concurrency, args.max_tokens))
            return answers, time.perf_counter() - started
        finally:
            process.terminate()
            process.wait(timeout=60)


async def _asked(ask: Ask[T], port: int, requests: int, concurrency: int, max_tokens: int) -> list[T]:
    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0) as client:

        async def limited(seed: int) -> T:
            async with gate:
                return await ask(client, seed, max_tokens)

        return list(await asyncio.gather(*(limited(seed) for seed in range(requests))))

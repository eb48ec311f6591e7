"""Structured output on the example LLM: how many sampled `json_schema` answers validate.

    pip install '.[llm]' && python benchmarks/openai_structured.py --requests 200 --concurrency 8

Starts `shoal serve --openai-port` on free ports (the example repository), then sends
`--requests` chat requests with `response_format: json_schema` (a person: a short name and an
integer age, nothing else), sampled (`temperature` 1, seed = the request's number), through the
official `openai` client, `--concurrency` at a time. Each answer is parsed and validated with
`jsonschema`; the run prints how many validated, how many ended by `max_tokens` first (finish
reason `length`, which no grammar can prevent), the failures' first texts, and the time taken.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import jsonschema
import openai

from benchmarks.openai_stream import MODEL, start_shoal

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


async def one(client: openai.AsyncOpenAI, seed: int, max_tokens: int) -> tuple[str, str]:
    answer = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    return answer.choices[0].message.content or "", answer.choices[0].finish_reason


def valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), PERSON)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


async def run(port: int, requests: int, concurrency: int, max_tokens: int) -> list[tuple[str, str]]:
    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0) as client:

        async def limited(seed: int) -> tuple[str, str]:
            async with gate:
                return await one(client, seed, max_tokens)

        return list(await asyncio.gather(*(limited(seed) for seed in range(requests))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as workdir:
        process, port = start_shoal(Path(workdir))
        try:
            started = time.perf_counter()
            answers = asyncio.run(run(port, args.requests, args.concurrency, args.max_tokens))
            took = time.perf_counter() - started
        finally:
            process.terminate()
            process.wait(timeout=60)
    good = [text for text, _ in answers if valid(text)]
    cut = [text for text, reason in answers if reason == "length"]
    bad = [text for text, reason in answers if reason != "length" and not valid(text)]
    print(f"{len(good)}/{len(answers)} validated against the schema in {took:.1f} s ({args.concurrency} at a time)")
    print(f"{len(cut)} ended by max_tokens ({args.max_tokens}); {len(bad)} invalid otherwise")
    for text in bad[:3]:
        print(f"  invalid: {text[:120]!r}")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

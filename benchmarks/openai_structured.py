"""Structured output on the example LLM: how many sampled `json_schema` answers validate.

    pip install '.[llm]' && python -m benchmarks.openai_structured --requests 200 --concurrency 8

Starts `shoal serve --openai-port` on free ports (the example repository), then sends
`--requests` chat requests with `response_format: json_schema` (a person: a short name and an
integer age, nothing else), sampled (`temperature` 1, seed = the request's number), through the
official `openai` client, `--concurrency` at a time. Each answer is parsed and validated with
`jsonschema`; the run prints how many validated, how many ended by `max_tokens` first (finish
reason `length`, which no grammar can prevent), the failures' first texts, and the time taken.
"""

from __future__ import annotations

import json
import os

import jsonschema
import openai

from benchmarks.openai_sampled import arguments, sample
from benchmarks.openai_stream import MODEL

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


def main() -> None:
    args = arguments(__doc__, 200, 96)
    answers, took = sample(one, args)
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

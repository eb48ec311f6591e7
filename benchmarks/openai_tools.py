"""Tool calling on the example LLM: how many sampled required calls parse and validate.

    pip install '.[llm]' && python -m benchmarks.openai_tools --requests 50 --concurrency 8

Starts `shoal serve --openai-port` on free ports (the example repository), then sends
`--requests` chat requests with two tools (a weather lookup whose arguments are a short city and
a unit, and a clock without arguments) and `tool_choice: "required"`, sampled (`temperature` 1,
seed = the request's number), through the official `openai` client, `--concurrency` at a time.
Each call's arguments are parsed and validated with `jsonschema` against its function's schema;
the run prints how many answers validated, how many ended by `max_tokens` first, which functions
were called, and the time taken.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import jsonschema
import openai

from benchmarks.openai_sampled import arguments, sample
from benchmarks.openai_stream import MODEL

SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "get_time": {"type": "object", "properties": {}, "additionalProperties": False},
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in SCHEMAS.items()
]


async def one(client: openai.AsyncOpenAI, seed: int, max_tokens: int) -> Any:
    answer = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed,
    )
    return answer.choices[0]


def valid(choice: Any) -> bool:
    calls = choice.message.tool_calls or []
    try:
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    except (json.JSONDecodeError, jsonschema.ValidationError, KeyError):
        return False
    return bool(calls) and choice.finish_reason == "tool_calls"


def main() -> None:
    args = arguments(__doc__, 50, 128)
    answers, took = sample(one, args)
    good = [a for a in answers if valid(a)]
    cut = [a for a in answers if a.finish_reason == "length"]
    called = collections.Counter(c.function.name for a in answers for c in a.message.tool_calls or [])
    print(
        f"{len(good)}/{len(answers)} answers were calls that validated, in {took:.1f} s ({args.concurrency} at a time)"
    )
    print(f"{len(cut)} ended by max_tokens ({args.max_tokens}); calls per function: {dict(called)}")
    for answer in [a for a in answers if not valid(a) and a.finish_reason != "length"][:3]:
        print(f"  invalid: {answer.message!r:.200}")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

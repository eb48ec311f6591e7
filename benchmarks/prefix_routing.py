"""Prefix-aware routing: time to first token on a multi-turn chat workload, routing on and off.

    pip install '.[llm]'
    python benchmarks/prefix_routing.py --workers 2,4 --conversations 8 --turns 3

`shoal serve --workers N --prefix-routing=<on|off>` on a repository holding only the example LLM
(SmolLM2-135M-Instruct, one instance per worker, one llama.cpp thread), whose engine keeps several
prompts' starts (`prefix_cache_entries` 8 in `prefix_cache_tokens` 4096: docs/openai.md).
`--conversations` chats run at once, each its own task: every one starts with the same system
prompt (about 190 tokens, which every instance soon caches), its first user message pastes the
customer's own order history (about 400 tokens), and each later turn sends the whole
conversation so far (the previous answers included) plus a short new question, streamed through
the official `openai` client (AsyncOpenAI), `temperature` 0. A turn's time to first token runs
from its request to the first text. Conversations go at their own pace, so turns interleave as a
chat service's do; with routing off, an instance sees every conversation and its cache holds
about six of the eight, with routing on it sees its own four.

Printed per worker count: TTFT p50 and p90 with routing on and off, for the turns after the first
(where a conversation's own history can be cached) and for all turns, the on/off ratios, and the
load average at the start and end of each run (the 2-core machine is shared). docs/openai.md has
a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.repository.llm_examples import LLM, LLM_CONFIG, LLM_MODEL, installed  # noqa: E402
from shared.process.natsserver import free_port  # noqa: E402

SYSTEM = (
    "You are the support assistant of a company that sells garden tools, seeds and outdoor furniture. "
    "Answer in a friendly, concise tone. Always check which product the customer means before giving "
    "advice; if the question is about an order, ask for the order number. Our return policy: 30 days "
    "for unused items, 14 days for seeds, no returns on custom furniture. Shipping takes 3 to 5 working "
    "days within the country and 7 to 12 days abroad; express shipping costs 12 euros. Warranty: two "
    "years on tools, five years on furniture frames, none on cushions. Never promise a refund yourself: "
    "say that the returns team decides within two days. Do not discuss competitors' products or prices. "
    "When a customer is unhappy, apologise once and offer a concrete next step. Keep answers short."
)
TOPICS = [
    "a broken hose reel",
    "tomato seeds that did not sprout",
    "a wobbly garden bench",
    "a late delivery",
    "choosing a lawn mower",
    "rust on a shovel",
    "a parasol that fades",
    "planting tulip bulbs",
]
FOLLOW_UPS = [
    "What would you suggest I do next, step by step?",
    "How long will that take, and who pays for it?",
    "Could you repeat the important points of your last answer briefly?",
    "Is there anything I should check on my side before contacting the returns team?",
    "Thanks. One more detail about it:",
]
# the engine keeps 8 prompts' starts in 4096 cells (of 8192): several conversations per instance
CACHE = {"max_sequences": "4", "prefix_cache_entries": "8", "prefix_cache_tokens": "4096"}


def repository(root: Path) -> Path:
    config = LLM_CONFIG.replace(
        'key: "max_sequences" value { string_value: "8" }', 'key: "max_sequences" value { string_value: "4" }'
    )
    config += "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
        for k, v in CACHE.items()
        if k != "max_sequences"
    )
    (root / LLM / "1").mkdir(parents=True, exist_ok=True)
    (root / LLM / "config.pbtxt").write_text(config)
    (root / LLM / "1" / "model.py").write_text(LLM_MODEL.lstrip())
    return root


def start(workdir: Path, workers: int, routing: bool) -> tuple[subprocess.Popen, int]:
    api = free_port()
    argv = [sys.executable, "-m", "shoal.cli", "serve", f"--model-repository={repository(workdir / 'models')}"]
    argv += ["--http-address=127.0.0.1", f"--http-port={free_port()}", f"--metrics-port={free_port()}"]
    argv += [f"--grpc-port={free_port()}", f"--openai-port={api}", f"--workers={workers}"]
    argv += [f"--prefix-routing={'true' if routing else 'false'}", "--request-timeout-secs=900"]  # a loaded host
    log = workdir / f"serve-{workers}-{routing}.log"
    process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"shoal serve exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/models", timeout=10) as response:
                if LLM.encode() in response.read() and loaded(log, workers):
                    return process, api
        except OSError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise TimeoutError("shoal serve did not start in 300 s")


def loaded(log: Path, workers: int) -> bool:
    """Every worker's instance has loaded (its engine logs its KV cells)."""
    return log.read_text(errors="replace").count("KV cells") >= workers


def history(index: int, rng: random.Random) -> str:
    """The customer's order history, pasted into the first message: each conversation's own long
    start (about 400 tokens), as a chat over a document or an account is."""
    items = [t.split()[-1] for t in TOPICS] + ["rake", "trowel", "hammock", "watering can"]
    orders = [
        f"order {index}-{k}: {rng.randint(1, 9)} x {rng.choice(items)} at {rng.randint(3, 400)} euros, "
        f"shipped on day {rng.randint(1, 28)} of month {rng.randint(1, 12)}"
        for k in range(18)
    ]
    return "My order history: " + "; ".join(orders) + "."


async def conversation(client, index: int, turns: int, max_tokens: int, ttft: list[tuple[int, float]]) -> None:
    rng = random.Random(index)
    topic = TOPICS[index % len(TOPICS)]
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        if turn == 0:
            ask = f"Customer {index}, about {topic}. {history(index, rng)} What should I do?"
        else:
            ask = f"{FOLLOW_UPS[turn % len(FOLLOW_UPS)]} (ticket {index}-{turn})"
        messages.append({"role": "user", "content": ask})
        start, first, answer = time.perf_counter(), 0.0, []
        stream = await client.chat.completions.create(
            model=LLM, messages=messages, max_tokens=max_tokens, temperature=0, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - start
                answer.append(chunk.choices[0].delta.content)
        ttft.append((turn, first))
        messages.append({"role": "assistant", "content": "".join(answer)})


async def workload(port: int, conversations: int, turns: int, max_tokens: int) -> list[tuple[int, float]]:
    from openai import AsyncOpenAI

    ttft: list[tuple[int, float]] = []
    async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=600) as client:
        await asyncio.gather(*(conversation(client, i, turns, max_tokens, ttft) for i in range(conversations)))
    return ttft


def quantiles(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), cuts[8]


def run(workers: int, routing: bool, args: argparse.Namespace) -> list[tuple[int, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        process, port = start(Path(tmp), workers, routing)
        try:
            load = os.getloadavg()[0]
            ttft = asyncio.run(workload(port, args.conversations, args.turns, args.max_tokens))
            print(
                f"  workers {workers} routing {'on ' if routing else 'off'}: load {load:.1f} -> {os.getloadavg()[0]:.1f}"
            )
            return ttft
        finally:
            process.terminate()
            process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="2", help="worker counts, comma-separated (default: 2)")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    if not installed(LLM):
        raise SystemExit("the llm extra is not installed: pip install '.[llm]' (docs/openai.md)")
    for workers in [int(w) for w in args.workers.split(",")]:
        results = {routing: run(workers, routing, args) for routing in (False, True)}
        for label, keep in (("turns 2+", lambda t: t > 0), ("turn 1", lambda t: t == 0), ("all turns", lambda t: True)):
            on = quantiles([s for t, s in results[True] if keep(t)])
            off = quantiles([s for t, s in results[False] if keep(t)])
            print(
                f"workers {workers} {label}: TTFT p50/p90 on {on[0]:.2f}/{on[1]:.2f} s, off {off[0]:.2f}/{off[1]:.2f} s;"
                f" on/off p50 {on[0] / off[0]:.2f}, p90 {on[1] / off[1]:.2f}"
            )


if __name__ == "__main__":
    main()

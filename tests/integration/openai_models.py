"""Small python models in the OpenAI front end's shapes (docs/openai.md), for its tests without
the `llm` extra: they answer in milliseconds, so the protocol is tested in every run.

- `echo`: a generation model that streams the words of its prompt back, one response per word
  (chat: the last message's words), honouring `max_tokens` and `seed` and counting usage. A
  prompt starting with "slow" leaves a `started-<request id>` file in its version folder, waits
  50 ms between words and, when its client goes away, leaves a `cancelled-<request id>` file.
  Asked for log probabilities (`top_logprobs`), word i has -0.25 (i + 1) and its `top_logprobs`
  likeliest are itself and `alt1`, `alt2`, ... each 1 less; a prompt starting with "forget"
  leaves the `logprobs` output out. It takes `tools` and `tool_choice` and ignores them: a
  message holding `<tool_call>...</tool_call>` comes back word by word as the model's calls.
  It declares LoRA adapters `shout` and `whisper` (files it never reads): a request's `lora_name`
  comes back first, as the word `<name>`, so a test sees which adapter the front end asked for.
- `plain`: the same without a `messages` input (no chat template) and without sampling inputs.
- `templated`: `plain` with a chat template in its config, which the front end applies.
- `hashing`: an embedding model: each word hashed into one of 64 dimensions, normalised.

`write_tool_parser_models`: `echo` again, and `echo-llama3`, the same with the config parameter
`tool_call_parser: llama3`: whatever call the message holds comes back in the model's text.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

ECHO = """
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _get(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


def _out(text, reason, prompt, done, logprobs=None):
    outputs = [
        pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
        pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
        pb_utils.Tensor("prompt_tokens", np.array([prompt], np.int32)),
        pb_utils.Tensor("completion_tokens", np.array([done], np.int32))]
    if logprobs is not None:
        outputs.append(pb_utils.Tensor("logprobs", np.array([json.dumps(logprobs).encode()], dtype=np.object_)))
    return pb_utils.InferenceResponse(output_tensors=outputs)


def _entry(piece, index, top):
    logprob = -0.25 * (index + 1)
    likeliest = [(piece, logprob)] + [(f"alt{j}", logprob - j) for j in range(1, top)]
    return {"token": piece, "logprob": logprob, "top_logprobs": [{"token": t, "logprob": lp} for t, lp in likeliest[:top]]}


class TritonPythonModel:
    def initialize(self, args):
        self.dir = pb_utils.get_model_dir()

    def execute(self, requests):
        for request in requests:
            self.answer(request, request.get_response_sender())
        return None

    def answer(self, request, sender):
        messages = _get(request, "messages")
        if messages is not None:
            prompt = json.loads(messages)[-1]["content"]
        else:
            prompt = _get(request, "text_input", b"").decode()
        words = prompt.split()
        adapter = _get(request, "lora_name", b"").decode()
        if adapter:
            words = [f"<{adapter}>", *words]
        if _get(request, "seed") is not None:  # a seed picks the order, as sampling would
            np.random.default_rng(int(_get(request, "seed"))).shuffle(words)
        limit = int(_get(request, "max_tokens", len(words)))
        stream = bool(_get(request, "stream", True))
        slow = prompt.startswith("slow")
        top = _get(request, "top_logprobs")
        asked = top is not None and not prompt.startswith("forget")
        entries = []
        if slow:
            open(os.path.join(self.dir, "started-" + request.request_id()), "w").close()
        sent = []
        for word in words[:limit]:
            if sender.is_cancelled():
                open(os.path.join(self.dir, "cancelled-" + request.request_id()), "w").close()
                sender.send(flags=FINAL)
                return
            piece = word if not sent else " " + word
            sent.append(piece)
            entries.append(_entry(piece, len(sent) - 1, int(top or 0)))
            if stream:
                sender.send(_out(piece, "", len(words), len(sent), entries[-1:] if asked else None))
            if slow:
                time.sleep(0.05)
        reason = "length" if limit < len(words) else "stop"
        held = ([] if stream else entries) if asked else None
        sender.send(_out("" if stream else "".join(sent), reason, len(words), len(sent), held), flags=FINAL)
"""

GENERATION_IO = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] }%s
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "prompt_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "completion_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "logprobs" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

ECHO_INPUTS = """,
  { name: "messages" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "seed" data_type: TYPE_INT64 dims: [ 1 ] optional: true },
  { name: "top_logprobs" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "tools" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "tool_choice" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "lora_name" data_type: TYPE_STRING dims: [ 1 ] optional: true }"""

ADAPTERS = """
parameters { key: "lora_adapters" value { string_value: '{"shout": "shout.gguf", "whisper": "whisper.gguf"}' } }
"""

HASHING = """
import zlib
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            words = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0].decode().lower().split()
            vector = np.zeros(64, np.float32)
            for word in words:
                vector[zlib.crc32(word.encode()) % 64] += 1
            vector /= max(np.linalg.norm(vector), 1e-6)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("VECTOR", vector.reshape(1, 64)),
                pb_utils.Tensor("prompt_tokens", np.array([[len(words)]], np.int32))]))
        return responses
"""

HASHING_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "VECTOR" data_type: TYPE_FP32 dims: [ 64 ] },
  { name: "prompt_tokens" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 1000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


TEMPLATE = """
parameters {
  key: "chat_template"
  value { string_value: "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}" }
}
parameters { key: "bos_token" value { string_value: "<s>" } }
"""


def _model(root: Path, name: str, config: str, source: str) -> None:
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n' + textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))


def write_openai_models(root: Path) -> Path:
    _model(root, "echo", GENERATION_IO % ECHO_INPUTS + ADAPTERS, ECHO)
    _model(root, "plain", GENERATION_IO % "", ECHO)
    _model(root, "templated", GENERATION_IO % "" + TEMPLATE, ECHO)
    _model(root, "hashing", HASHING_CONFIG, HASHING)
    return root


LLAMA3_PARSER = """
parameters { key: "tool_call_parser" value { string_value: "llama3" } }
"""


def write_tool_parser_models(root: Path) -> Path:
    _model(root, "echo", GENERATION_IO % ECHO_INPUTS, ECHO)
    _model(root, "echo-llama3", GENERATION_IO % ECHO_INPUTS + LLAMA3_PARSER, ECHO)
    return root

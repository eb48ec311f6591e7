"""LoRA adapters on the real model (SmolLM2-135M-Instruct through llama.cpp), with the llm extra:
an adapter written here (tests/llm_adapters.py) makes the engine generate, greedily and alone,
exactly what llama-cpp-python's own `Llama` generates with the same adapter (`lora_path`), and the
base model beside it still generates what `Llama` does without one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from services.repository.llm_examples import LLM, installed
from tests.llm_adapters import smollm2_gguf, write_lora
from tests.shoal.llm.test_real_model import Sink, chat, reference_text

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'"),
    pytest.mark.skipif(
        importlib.util.find_spec("gguf") is None, reason="needs gguf (the test extra) to write adapters"
    ),
]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from llama_cpp import Llama

    from shoal.llm.engine import Engine, Limits
    from shoal.llm.llama_c_api import ContextSettings, Library, LlamaModel, library_folder
    from shoal.llm.probe import choose

    gguf = smollm2_gguf()
    adapter = write_lora(gguf, Path(tmp_path_factory.mktemp("lora")) / "adapter.gguf", seed=1)
    library = Library.start(choose(gguf, [library_folder()]).variant)
    model = LlamaModel(gguf, ContextSettings(n_ctx=2048, max_sequences=4), library)
    index = model.load_adapter(adapter)
    engine = Engine(model, Limits(max_sequences=4, n_batch=512, max_sequence_tokens=512, prefix_cache_tokens=0))
    plain = Llama(model_path=str(gguf), n_ctx=512, n_threads=1, verbose=False)
    adapted = Llama(model_path=str(gguf), n_ctx=512, n_threads=1, verbose=False, lora_path=str(adapter))
    yield model, engine, index, plain, adapted
    engine.close()
    model.close()


def generate(engine, prompt: list[int], adapter: int | None, max_tokens: int = 12) -> str:
    from shoal.llm.engine import Job

    sink = Sink()
    engine.submit(Job(prompt, sink, max_tokens, temperature=0.0, adapter=adapter))
    assert sink.done.wait(120) and not sink.reason.startswith("failed"), sink.reason
    return "".join(sink.pieces)


def test_an_adapter_generates_what_llama_cpp_python_does_with_it(setup):
    model, engine, index, plain, adapted = setup
    prompt = chat(model, QUESTION)
    with_adapter = generate(engine, prompt, index)
    assert with_adapter == reference_text(model, adapted, prompt, 12)
    base = generate(engine, prompt, None)  # switched back: the base model's own answer
    assert base == reference_text(model, plain, prompt, 12) and base != with_adapter


def test_an_unloadable_adapter_is_refused_with_the_reason(setup, tmp_path: Path):
    from shoal.llm.llama_c_api import LlamaError

    model = setup[0]
    not_gguf = tmp_path / "adapter.gguf"
    not_gguf.write_bytes(b"not a gguf file")
    with pytest.raises(LlamaError, match="cannot load the LoRA adapter"):
        model.load_adapter(not_gguf)

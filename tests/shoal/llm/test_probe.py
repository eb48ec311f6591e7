"""The probe (shoal/llm/probe.py) against real child processes that die.

The stand-ins are CPU backends compiled here from a few lines of C: their `ggml_backend_score`
or `ggml_backend_init` executes an undefined instruction (`__builtin_trap`, ud2 on x86-64), so
the child that loads them dies with SIGILL exactly as a library built for another CPU does.
The tests that load llama.cpp itself need the llm extra.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from shoal.llm import probe

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the stand-in backends")
needs_llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="needs the llm extra: pip install '.[llm]'"
)


def standin(folder: Path, name: str, score: str, init: str = "return 0;") -> Path:
    """A CPU backend library `libggml-cpu-<name>.so` whose functions have these C bodies."""
    source = folder / f"{name}.c"
    source.write_text(f"int ggml_backend_score(void) {{ {score} }}\nvoid *ggml_backend_init(void) {{ {init} }}\n")
    library = folder / f"libggml-cpu-{name}.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def test_a_signal_is_named_with_what_it_means():
    assert probe._died(-4).startswith("died with SIGILL: an instruction this CPU")
    assert probe._died(-11).startswith("died with SIGSEGV")
    assert probe._died(3) == "exited with code 3"


@needs_cc
def test_a_backend_whose_loading_dies_scores_zero_and_the_others_are_still_scored(tmp_path):
    good = standin(tmp_path, "good", "return 42;")
    dies = standin(tmp_path, "dies", "__builtin_trap(); return 0;")  # sorted first: the first child dies at once
    also = standin(tmp_path, "zzz", "return 7;")
    assert probe.variants([tmp_path]) == [dies, good, also]
    assert probe.scores([dies, good, also]) == {dies: 0, good: 42, also: 7}


@needs_cc
def test_no_backend_that_scores_here_fails_the_choice_naming_them(tmp_path):
    standin(tmp_path, "nothing", "return 0;")
    standin(tmp_path, "dies", "__builtin_trap(); return 1;")
    with pytest.raises(
        probe.ProbeFailed, match=r"none of llama.cpp's CPU backends runs on this CPU \(libggml-cpu-dies.so"
    ):
        probe.choose(tmp_path / "model.gguf", [tmp_path])


@needs_cc
@needs_llama
def test_a_backend_that_dies_with_sigill_in_the_trial_fails_the_choice_with_the_reason(tmp_path):
    standin(tmp_path, "trap", "return 1 << 20;", "__builtin_trap(); return 0;")
    with pytest.raises(probe.ProbeFailed) as failed:
        probe.choose(tmp_path / "model.gguf", [tmp_path])
    assert "libggml-cpu-trap.so: llama.cpp died with SIGILL: an instruction this CPU" in str(failed.value)


@needs_llama
def test_a_file_llama_cpp_cannot_load_fails_the_trial_with_its_words(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(probe.ProbeFailed, match=r"llama.cpp exited with code 1 \(LlamaError: llama.cpp cannot load"):
        probe.trial(bad, None)

"""A llama.cpp that dies on this CPU fails the LLM's load with the reason, never a restart loop.

The example LLM is served from a repository of its own whose config points its probe at a
stand-in CPU backend compiled here: its `ggml_backend_init` executes an undefined instruction
(`__builtin_trap`, ud2), so the probe's child dies with SIGILL exactly as a library built for
another CPU does. Alone, the stand-in fails the load with SIGILL in the reason, and nothing
restarts; beside a portable build's real backends (tried after it, lower scores), the model
loads on a real one and generates.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import openai
import pytest
import tritonclient.http as httpclient

from services.repository.llm_examples import LLM, LLM_CONFIG, LLM_MODEL, installed
from shared.process.natsserver import free_port
from shoal.llm.llama_c_api import library_folder
from shoal.llm.probe import variants
from tests.serving import Serve, wait_until

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'"),
    pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the stand-in backend"),
    pytest.mark.timeout(400),
]


def standin(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "trap.c"
    source.write_text(
        "int ggml_backend_score(void) { return 1 << 20; }\nvoid *ggml_backend_init(void) { __builtin_trap(); return 0; }\n"
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / "libggml-cpu-trap.so"), str(source)], check=True)
    return folder


def repository(root: Path, backends: str) -> Path:
    model = root / "models" / LLM
    (model / "1").mkdir(parents=True)
    parameter = f'parameters {{ key: "llama_cpu_backends" value {{ string_value: "{backends}" }} }}\n'
    (model / "config.pbtxt").write_text(LLM_CONFIG + parameter)
    (model / "1" / "model.py").write_text(LLM_MODEL.lstrip())
    return root / "models"


def serve(root: Path, backends: str) -> tuple[Serve, int]:
    port = free_port()
    running = Serve(root, [f"--model-repository={repository(root, backends)}", f"--openai-port={port}"])
    return running.start(ready_timeout=300), port


def state(running: Serve) -> dict:
    client = httpclient.InferenceServerClient(running.url, network_timeout=30)
    return {entry["name"]: entry for entry in client.get_model_repository_index()}.get(LLM, {})


def test_a_library_that_dies_with_sigill_fails_the_load_with_the_reason_and_is_not_restarted(tmp_path):
    running, port = serve(tmp_path, str(standin(tmp_path / "backends")))
    try:
        entry = state(running)
        assert entry.get("state") == "UNAVAILABLE", entry
        assert "SIGILL" in entry.get("reason", "") and "libggml-cpu-trap.so" in entry["reason"], entry
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=30) as client:
            with pytest.raises(openai.APIStatusError):
                client.completions.create(model=LLM, prompt="Hello", max_tokens=2)
        time.sleep(3)  # a restart loop would show within seconds
        assert "restarting it" not in running.log() and state(running).get("state") == "UNAVAILABLE"
        running.terminate(60)
    finally:
        if running.process is not None and running.process.poll() is None:
            running.kill_tree()


@pytest.mark.skipif(
    not installed(LLM) or not variants([library_folder()]),  # read at collection: without the extra too
    reason="needs the portable build of llama-cpp-python (docs/openai.md)",
)
def test_a_backend_that_dies_is_passed_over_for_the_next_that_runs(tmp_path):
    backends = f"{standin(tmp_path / 'backends')}:{library_folder()}"
    running, port = serve(tmp_path, backends)
    try:
        wait_until(lambda: state(running).get("state") == "READY", 120, "the LLM to load")
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=60) as client:
            answer = client.completions.create(model=LLM, prompt="One, two, three,", max_tokens=4, temperature=0)
        assert answer.choices[0].text and answer.usage.completion_tokens > 0
        assert "CPU backend libggml-cpu-trap.so failed its trial (llama.cpp died with SIGILL" in running.log()
        running.terminate(60)
    finally:
        if running.process is not None and running.process.poll() is None:
            running.kill_tree()

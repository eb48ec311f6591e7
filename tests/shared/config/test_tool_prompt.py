"""Tools in a chat prompt (shared/config/tool_prompt.py through chat_template.render_chat): a
template that reads `tools` renders them itself; any other gets the Hermes-style text."""

from __future__ import annotations

import json

from shared.config.chat_template import render_chat
from shared.config.tool_prompt import call_text, reads_tools

# SmolLM2-135M-Instruct's own template (from its GGUF): no tools, no tool role
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# a template that renders tools itself, as Qwen 2.5's does (shortened)
WITH_TOOLS = (
    "{% if tools %}TOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}|{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %} CALL {{ c.function.name }} {{ c.function.arguments.city }}{% endfor %}"
    "|{% endfor %}"
)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "20C", "tool_call_id": "call_1"},
]


def test_which_templates_read_tools():
    assert reads_tools(WITH_TOOLS) and not reads_tools(SMOLLM2)


def test_a_template_without_tools_gets_them_in_a_system_message_and_calls_as_text():
    prompt = render_chat(SMOLLM2, CONVERSATION, tools=[TOOL])
    system, user, assistant, result, _ = prompt.split("<|im_start|>")[1:]
    assert system.startswith("system\n# Tools") and f"<tools>\n{json.dumps(TOOL)}\n</tools>" in system
    assert "You are a helpful AI assistant named SmolLM" not in prompt  # ours is the system message
    assert user == "user\nWeather in Paris?<|im_end|>\n"
    assert assistant == "assistant\n" + call_text("get_weather", {"city": "Paris"}) + "<|im_end|>\n"
    assert result == "user\n<tool_response>\n20C\n</tool_response><|im_end|>\n"


def test_a_system_message_keeps_its_text_before_the_tools():
    prompt = render_chat(SMOLLM2, [{"role": "system", "content": "Be brief."}, *CONVERSATION[:1]], tools=[TOOL])
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_a_template_that_reads_tools_gets_them_and_the_arguments_as_an_object():
    assert render_chat(WITH_TOOLS, CONVERSATION, tools=[TOOL]) == (
        "TOOLS get_weather |user: Weather in Paris?|assistant:  CALL get_weather Paris|tool: 20C|"
    )


def test_without_tools_a_conversation_renders_as_before():
    messages = [{"role": "user", "content": "Hi"}]
    assert render_chat(SMOLLM2, messages) == render_chat(SMOLLM2, messages, tools=None)
    assert "# Tools" not in render_chat(SMOLLM2, messages)

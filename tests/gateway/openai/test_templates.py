from __future__ import annotations

import pytest

from services.gateway.openai.openai_errors import OpenAIError
from services.gateway.openai.templates import render_chat
from shared.config.model_config import ModelSpec


def _spec(template: str) -> ModelSpec:
    return ModelSpec(
        "m", "", "python", 0, (), (), None, 1, "KIND_CPU", True, "", parameters={"chat_template": template}
    )


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_chatml_template_renders_as_a_tokenizer_would():
    prompt = render_chat(_spec(CHATML), [{"role": "user", "content": "Hi"}])
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_refuses_the_conversation_is_a_400():
    spec = _spec("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}")
    with pytest.raises(OpenAIError, match="user first") as refused:
        render_chat(spec, [{"role": "assistant", "content": "x"}])
    assert refused.value.status == 400


def test_the_sandbox_keeps_templates_away_from_python():
    with pytest.raises(OpenAIError):
        render_chat(_spec("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}"), [])


def test_loop_controls_and_tojson_work_as_in_hugging_face_templates():
    source = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m | tojson }}{% endfor %}"
    assert render_chat(_spec(source), [{"role": "user", "content": "é<"}, {"role": "user", "content": "no"}]) == (
        '{"role": "user", "content": "é<"}'
    )

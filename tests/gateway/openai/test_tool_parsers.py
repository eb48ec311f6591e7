"""The tool-call parser a model gets: its config's, else the gateway's flag's
(services/gateway/openai/tool_parsers.py)."""

from __future__ import annotations

import pytest

from services.gateway.openai.json_tool_calls import Llama3Parser, MistralParser
from services.gateway.openai.openai_errors import OpenAIError
from services.gateway.openai.tool_calls import CallParser
from services.gateway.openai.tool_parsers import tool_parser
from shared.config.model_config import ModelSpec
from shared.process.settings import GatewaySettings


def spec(**parameters: str) -> ModelSpec:
    return ModelSpec("m", "", "python", 0, (), (), None, 1, "KIND_CPU", True, "", parameters=parameters)


def test_the_config_wins_over_the_flag_and_hermes_is_the_default():
    assert type(tool_parser(spec(), True)) is CallParser
    assert type(tool_parser(spec(), True, "mistral")) is MistralParser
    assert type(tool_parser(spec(tool_call_parser="llama3"), True, "mistral")) is Llama3Parser
    assert not tool_parser(spec(tool_call_parser="mistral"), False).parallel


def test_an_unknown_parser_in_the_config_is_a_server_error_naming_it():
    with pytest.raises(OpenAIError, match="tool_call_parser 'qwen' is not one of hermes, llama3, mistral") as raised:
        tool_parser(spec(tool_call_parser="qwen"), True)
    assert raised.value.status == 500


def test_the_flag_takes_tritons_names_only():
    assert GatewaySettings(tool_call_parser="llama3").tool_call_parser == "llama3"
    with pytest.raises(ValueError):
        GatewaySettings(tool_call_parser="qwen")


def test_forcing_a_call_with_a_parser_other_than_hermes_is_the_clients_error_naming_both():
    assert type(tool_parser(spec(), True, forced=True)) is CallParser
    for name in ("llama3", "mistral"):
        assert tool_parser(spec(tool_call_parser=name), True)  # auto: the model calls as it likes
        with pytest.raises(OpenAIError, match=f"hermes format only; model 'm' has tool_call_parser '{name}'") as raised:
            tool_parser(spec(tool_call_parser=name), True, forced=True)
        assert raised.value.status == 400 and raised.value.param == "tool_choice"

"""`shoal serve`'s OpenAI API key (services/gateway/openai/api_keys.py): checked before anything
starts, and handed to the gateways in their environment, never on their command lines (which
every user of the host can read)."""

from __future__ import annotations

import argparse

from pydantic import SecretStr

from services.gateway.openai.api_keys import ApiKeys

ENVIRONMENT = "SHOAL_GATEWAY_OPENAI_API_KEY"  # GatewaySettings.openai_api_key's variable


def given(args: argparse.Namespace) -> str:
    """`--openai-api-key` as given (its default is the setting's SecretStr)."""
    key = getattr(args, "openai_api_key", "")
    return key.get_secret_value() if isinstance(key, SecretStr) else str(key or "")


def problem(args: argparse.Namespace) -> str | None:
    """Why the OpenAI front end's keys cannot be read (a file that is missing or empty), if so."""
    if not args.openai_port:
        return None
    try:
        ApiKeys.load(given(args), args.openai_api_key_file)
    except ValueError as exc:
        return str(exc)
    return None


def environment(args: argparse.Namespace) -> dict[str, str]:
    key = given(args)
    return {ENVIRONMENT: key} if key else {}

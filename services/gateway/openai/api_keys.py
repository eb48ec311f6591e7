"""The OpenAI front end's API keys (docs/openai.md, "API keys").

Off unless a key is set: `--openai-api-key-file` (one key per line, `#` comments; several keys let
one be rotated out while clients move to the next) and the environment's
`SHOAL_GATEWAY_OPENAI_API_KEY` (`shoal serve --openai-api-key` puts it there for its gateways: a
child's environment is readable by its user only, its command line by everyone). A client sends
`Authorization: Bearer <key>`, as the official `openai` client does; without a key it allows, it
gets 401 in OpenAI's error shape, which the client raises as `AuthenticationError`. Keys are
compared in constant time and never logged or echoed back.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from services.gateway.openai.openai_errors import OpenAIError


class ApiKeys:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [key.encode() for key in keys if key]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    @classmethod
    def load(cls, key: str, key_file: str) -> ApiKeys:
        """The keys from the setting and the file; ValueError (naming the file, never a key) when
        the file cannot be read or holds none."""
        keys = [key] if key else []
        if key_file:
            try:
                text = Path(key_file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read --openai-api-key-file {key_file}: {exc}") from None
            found = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            if not found:
                raise ValueError(f"--openai-api-key-file {key_file} holds no key")
            keys += found
        return cls(keys)

    def check(self, authorization: str | None) -> None:
        """Raises OpenAI's 401 unless the `Authorization` header carries an allowed key."""
        if not self._keys:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise OpenAIError(
                "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
                "(Authorization: Bearer YOUR_KEY).",
                401,
            )
        candidate = given.strip().encode()
        # every key compared, each in constant time: the answer's timing says nothing about which
        allowed = [hmac.compare_digest(candidate, key) for key in self._keys]
        if not any(allowed):
            raise OpenAIError("Incorrect API key provided.", 401, code="invalid_api_key")

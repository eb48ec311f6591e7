"""A model config's `parameters` as Triton's C++ backends read them: string values, parsed on use."""

from __future__ import annotations

from shared.config.model_config import ModelSpec
from shared.errors import invalid


def integer(spec: ModelSpec, key: str, default: int = 0) -> int:
    """An integer parameter; one that does not parse fails the load naming the parameter."""
    value = spec.parameters.get(key, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise invalid(f"model '{spec.model_name}': parameter '{key}' must be an integer, got '{value}'") from None


def yes(spec: ModelSpec, key: str) -> bool:
    """A YES/NO parameter (OpenVINO's spelling; true/1/on count too)."""
    return spec.parameters.get(key, "").strip().lower() in ("yes", "true", "1", "on")

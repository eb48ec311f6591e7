"""PyTriton's clients (`from shoal.pytriton.client import ModelClient`)."""

from shoal.pytriton.client.client import (
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)

__all__ = ["AsyncioModelClient", "DecoupledModelClient", "FuturesModelClient", "ModelClient"]

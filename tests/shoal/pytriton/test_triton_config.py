"""TritonConfig → `shoal serve`'s flags: PyTriton's fields and environment variables reach the
embedded cluster's gateway (gRPC's included)."""

from __future__ import annotations

import pathlib

import pytest

from shoal.pytriton.embedded import _parse, serve_flags
from shoal.pytriton.exceptions import PyTritonValidationError
from shoal.pytriton.triton import TritonConfig, _merged
from shoal.supervisor import build_cluster


def test_grpc_fields_become_serve_flags():
    config = TritonConfig(grpc_port=18001, grpc_address="127.0.0.1", allow_grpc=False, http_port=18000)
    assert sorted(serve_flags(config)) == [
        "--allow-grpc=false",
        "--grpc-address=127.0.0.1",
        "--grpc-port=18001",
        "--http-port=18000",
    ]


def test_environment_reaches_the_gateways_grpc_settings(monkeypatch):
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_PORT", "18101")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_GRPC_ADDRESS", "127.0.0.1")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_ALLOW_GRPC", "true")
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_PORT", "18100")
    config = _merged(TritonConfig(http_port=18200))  # an explicit field wins over the environment
    assert (config.grpc_port, config.grpc_address, config.allow_grpc, config.http_port) == (
        18101,
        "127.0.0.1",
        True,
        18200,
    )
    args = _parse([*serve_flags(config), "--model-repository=/tmp", "--model-control-mode=explicit"])
    gateway = build_cluster(args, "nats://127.0.0.1:4222", pathlib.Path("/tmp")).gateway
    assert (gateway.grpc_port, gateway.grpc_address, gateway.allow_grpc, gateway.http_port) == (
        18101,
        "127.0.0.1",
        True,
        18200,
    )


def test_grpc_off_and_the_default_port():
    args = _parse([*serve_flags(TritonConfig(allow_grpc=False)), "--model-repository=/tmp"])
    assert args.allow_grpc is False
    assert _parse(["--model-repository=/tmp"]).grpc_port == 8001  # tritonserver's default, as `shoal serve`


def test_a_setting_shoal_refuses_is_a_validation_error():
    with pytest.raises(PyTritonValidationError, match="--cache-config 'nope' is not supported"):
        _parse([*serve_flags(TritonConfig(cache_config=["nope,size=1"])), "--model-repository=/tmp"])


def test_http_off_reaches_the_gateway():
    args = _parse([*serve_flags(TritonConfig(allow_http=False)), "--model-repository=/tmp"])
    assert build_cluster(args, "nats://127.0.0.1:4222", pathlib.Path("/tmp")).gateway.allow_http is False

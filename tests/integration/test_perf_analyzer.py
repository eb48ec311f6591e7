"""Triton's own perf_analyzer against Shoal: metadata, config, stats and binary inference.

The binary comes from the tritonclient 2.41.0 wheel (benchmarks/get_perf_analyzer.sh
fetches it and the CUDA runtime library it links, from PyPI). Where it cannot be
fetched the tests skip and say why.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster import running_cluster


@pytest.fixture(scope="module")
def served(test_repository):
    with running_cluster(test_repository, allow_client_shm=True) as running:
        yield running


def run(binary: str, url: str, *args: str) -> str:
    out = subprocess.run(
        [
            binary,
            "-u",
            url,
            "--measurement-interval",
            "1000",
            "--max-trials",
            "10",  # windows a loaded machine may need before three agree
            "--stability-percentage",
            "1000",  # these check the protocol, not stability: a shared test machine never settles
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "Throughput:" in text, text[-3000:]
    return text


@pytest.mark.parametrize("model", ["simple", "mlp"])
def test_perf_analyzer_runs(perf_analyzer, served, model):
    text = run(perf_analyzer, served.url, "-m", model, "--concurrency-range", "4")
    assert "Successful request count" in text  # the server-side columns come from /stats


def test_perf_analyzer_with_system_shared_memory(perf_analyzer, served):
    run(
        perf_analyzer,
        served.url,
        "-m",
        "identity_fp32",
        "--shape",
        "INPUT0:4096",
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        "16384",
        "--concurrency-range",
        "2",
    )
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(served.url)
    assert client.get_system_shared_memory_status() == []  # perf_analyzer unregistered what it registered
    client.close()


@pytest.mark.parametrize("model", ["simple", "mlp"])
def test_perf_analyzer_over_grpc(perf_analyzer, served, model):
    text = run(perf_analyzer, served.grpc_url, "-i", "grpc", "-m", model, "--concurrency-range", "4")
    assert "Successful request count" in text  # the server-side columns come from ModelStatistics


def test_perf_analyzer_over_a_grpc_stream(perf_analyzer, served):
    run(perf_analyzer, served.grpc_url, "-i", "grpc", "--streaming", "-m", "simple", "--concurrency-range", "4")


def test_perf_analyzer_over_grpc_with_system_shared_memory(perf_analyzer, served):
    run(
        perf_analyzer,
        served.grpc_url,
        "-i",
        "grpc",
        "-m",
        "identity_fp32",
        "--shape",
        "INPUT0:4096",
        "--shared-memory",
        "system",
        "--output-shared-memory-size",
        "16384",
        "--concurrency-range",
        "2",
    )

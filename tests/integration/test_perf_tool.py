"""`shoal perf` and `shoal analyze` against a real cluster (explicit model control mode)."""

from __future__ import annotations

import csv
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from shoal.perf.measure import server_delta
from shoal.perf.options import PerfOptions
from shoal.perf.run import measure
from tests.cluster import build_test_repository, running_cluster
from tests.integration import stream_models
from tests.serving import until, wait_until
from tests.shoal.analyze.pbtxt import parse_pbtxt
from tests.shoal.perf.test_output import PERF_ANALYZER_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
SHOAL = [sys.executable, "-m", "shoal.cli"]
QUICK = ["-p", "400", "-s", "100", "-r", "4"]  # short windows; a loaded CI machine is never "stable" at 10 %


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # the test models plus a decoupled generator (`gen`: one response per PROMPT value)
    root = build_test_repository(tmp_path_factory.mktemp("perf-models"))
    stream_models.write_models(root)
    repository = {"model_control_mode": "explicit", "load_model": ["simple", "identity_fp32", "gen"]}
    with running_cluster(root, repository=repository, allow_client_shm=True) as running:
        yield running


@pytest.fixture
def client(served):
    c = httpclient.InferenceServerClient(served.url, network_timeout=120)
    yield c
    c.close()


def shoal(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    out = subprocess.run([*SHOAL, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_perf_counts_agree_with_the_statistics_endpoint(served, client, protocol):
    before = client.get_inference_statistics("identity_fp32")
    url = served.grpc_url if protocol == "grpc" else served.url
    options = PerfOptions(
        model="identity_fp32", url=url, protocol=protocol, concurrency=[1, 3], shapes={"INPUT0": [16]},
        batch_size=2, window_ms=400, stability_pct=100, max_trials=4,
    )  # fmt: skip
    results = await measure(options)
    delta = server_delta(before, client.get_inference_statistics("identity_fp32"))
    sent = sum(r.completed for r in results)
    assert sent > 0 and delta.requests == sent
    assert delta.inferences == 2 * sent
    for r in results:
        # the windows' own server side (over gRPC read through ModelStatistics): the same requests,
        # give or take those crossing a window's edge
        assert abs(r.server.requests - r.client.requests) <= 0.25 * r.client.requests + 2 * r.level
        assert r.server.compute_infer_us > 0 and r.server.avg_batch_size >= 1
        assert 0 < r.client.percentiles_us[50] <= r.client.percentiles_us[99]


def test_perf_cli_writes_perf_analyzers_csv(served, tmp_path):
    csv_path = tmp_path / "perf.csv"
    out = shoal("perf", "-m", "simple", "-u", served.url, "--concurrency-range", "1:2", *QUICK, "-f", str(csv_path))
    assert "infer/s" in out.stdout and "p99 ms" in out.stdout
    with open(csv_path) as f:
        header = next(csv.reader(f))
        f.seek(0)
        rows = list(csv.DictReader(f))
    assert header[: len(PERF_ANALYZER_COLUMNS)] == PERF_ANALYZER_COLUMNS
    assert sorted(r["Concurrency"] for r in rows) == ["1", "2"]
    assert all(float(r["Inferences/Second"]) > 0 and int(r["p99 latency"]) > 0 for r in rows)


def _perf_analyzer() -> str | None:
    for candidate in (ROOT / "benchmarks" / ".tools" / "perf_analyzer", Path("/tmp/anchor-venv/bin/pa")):
        if candidate.exists():
            return str(candidate)
    return None


def test_csv_columns_are_what_perf_analyzer_writes(served, tmp_path):
    binary = _perf_analyzer()
    if binary is None:
        pytest.skip("perf_analyzer is not installed (benchmarks/get_perf_analyzer.sh fetches it)")
    theirs, ours = tmp_path / "pa.csv", tmp_path / "ours.csv"
    pa = subprocess.run(
        [binary, "-m", "simple", "-u", served.url, "-p", "400", "-s", "1000", "-f", str(theirs), "--verbose-csv"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert pa.returncode == 0, pa.stdout[-2000:] + pa.stderr[-2000:]
    shoal("perf", "-m", "simple", "-u", served.url, *QUICK, "-f", str(ours))
    their_header = theirs.read_text().splitlines()[0].split(",")
    assert ours.read_text().splitlines()[0].split(",")[: len(their_header)] == their_header


async def test_perf_over_system_shared_memory_cleans_up(served, client):
    options = PerfOptions(
        model="simple", url=served.url, concurrency=[2], window_ms=300, stability_pct=100, max_trials=3,
        shared_memory="system",
    )  # fmt: skip
    (result,) = await measure(options)
    assert result.completed > 0 and result.server.requests > 0
    assert client.get_system_shared_memory_status() == []
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"perf_{os.getpid()}_")]


def test_perf_cli_over_grpc(served, client, tmp_path):
    before = client.get_inference_statistics("simple")
    csv_path = tmp_path / "perf.csv"
    shoal("perf", "-m", "simple", "-i", "grpc", "-u", served.grpc_url, "--concurrency-range", "2", *QUICK,
          "-f", str(csv_path))  # fmt: skip
    (row,) = list(csv.DictReader(csv_path.read_text().splitlines()))
    assert row["Concurrency"] == "2" and float(row["Inferences/Second"]) > 0
    assert server_delta(before, client.get_inference_statistics("simple")).requests > 0


@pytest.mark.parametrize("model", ["identity_fp32", "gen"])
async def test_perf_streaming_counts_agree_with_the_statistics_endpoint(served, client, model):
    """--streaming: requests on gRPC streams, each done at its final response (a decoupled model's many)."""
    before = client.get_inference_statistics(model)
    options = PerfOptions(
        model=model, url=served.grpc_url, protocol="grpc", streaming=True, concurrency=[3],
        shapes={"identity_fp32": {"INPUT0": [16]}, "gen": {"PROMPT": [4]}}[model], window_ms=400, stability_pct=100, max_trials=4,
    )  # fmt: skip
    (result,) = await measure(options)
    assert result.completed > 0

    # a request is counted when its completion reaches the scheduler, which travels apart from its
    # final response (as in Triton, where a request is released after its final response is sent)
    def all_counted() -> bool:
        return server_delta(before, client.get_inference_statistics(model)).requests == result.completed

    await until(all_counted, 10, f"the statistics counting the {result.completed} completed requests")
    assert 0 < result.client.percentiles_us[50] <= result.client.percentiles_us[99]


def test_perf_cli_streaming_flags(served):
    out = subprocess.run([*SHOAL, "perf", "-m", "simple", "-u", served.url, "--streaming"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert out.returncode == 1 and "streaming is only allowed with gRPC protocol" in out.stderr
    # a decoupled model without --streaming: Triton's answer, not a hang
    out = subprocess.run([*SHOAL, "perf", "-m", "gen", "-i", "grpc", "-u", served.grpc_url, "--shape", "PROMPT:2",
                          *QUICK], capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert out.returncode == 1
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in out.stderr
    shoal("perf", "-m", "gen", "-i", "grpc", "-u", served.grpc_url, "--streaming", "--shape", "PROMPT:2", *QUICK)


def test_analyze_writes_a_config_shoal_loads_and_restores_the_original(served, client, tmp_path):
    original = client.get_model_config("simple")
    out = tmp_path / "analysis"
    shoal(
        "analyze", "-m", "simple", "-u", served.url, "--max-minutes", "0.5", "--concurrency", "1:2",
        "--max-instances", "2", "--max-batch-size", "16", *QUICK, "--output", str(out),
    )  # fmt: skip
    assert client.get_model_config("simple") == original
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"Config", "Instances", "Inferences/Second", "p99 latency"} <= set(rows[0])
    assert "Pareto front" in (out / "report.html").read_text()
    recommended = parse_pbtxt((out / "config.pbtxt").read_text())
    assert recommended["name"] == "simple" and recommended["input"] == parse_pbtxt(_pbtxt(original))["input"]
    try:
        client.load_model("simple", config=json.dumps(recommended))
        assert client.is_model_ready("simple")
        got = client.get_model_config("simple")
        assert got["instance_group"][0]["count"] == recommended["instance_group"][0]["count"]
        assert got["max_batch_size"] == recommended["max_batch_size"]
    finally:
        client.load_model("simple")
    assert client.get_model_config("simple") == original


def _pbtxt(config: dict) -> str:
    from shoal.analyze.configs import to_pbtxt

    return to_pbtxt(config)


def _lines(stream) -> tuple[queue.Queue, threading.Thread]:
    """The stream's lines as they come, read by a thread that closes it at its end."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        with stream:
            for line in stream:
                lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def test_analyze_puts_the_original_back_after_an_interrupt(served, client, tmp_path):
    original = client.get_model_config("simple")
    proc = subprocess.Popen(
        [*SHOAL, "analyze", "-m", "simple", "-u", served.url, "--max-minutes", "5", "--concurrency", "1:4",
         *QUICK, "--output", str(tmp_path / "interrupted")],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    (lines, reader), tried = _lines(proc.stderr), []
    try:

        def second_candidate_tried() -> bool:
            while not lines.empty():
                tried.append(lines.get())
            return sum("trying" in line for line in tried) >= 2

        wait_until(second_candidate_tried, 120, "a second candidate")
        wait_until(lambda: client.get_model_config("simple") != original, 60, "a candidate's config to load")
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)  # an impatient second Ctrl-C must not cut the restore short
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)  # it closes the pipe once the process has gone
    assert client.get_model_config("simple") == original
    assert not (tmp_path / "interrupted" / "config.pbtxt").exists()
    shutil.rmtree(tmp_path / "interrupted", ignore_errors=True)

"""examples/pytriton/: each server script run as a process (the embedded cluster on free ports, set
through PyTriton's `PYTRITON_TRITON_CONFIG_*` variables), its client script unchanged, plus
tritonclient and curl; SIGINT stops a server cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shared.process.natsserver import free_port
from tests.serving import alive, command_of, descendants, listening, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pytriton"
pytestmark = pytest.mark.timeout(300)


def _ready(port: int, model: str) -> bool:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=5)
    try:
        return client.is_model_ready(model)
    except Exception:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def example(
    script: str, model: str, *args: str, env: dict | None = None, returncode: int = 0
) -> Iterator[tuple[int, int, subprocess.Popen]]:
    """The server script as a process with every endpoint on a free port; yields (HTTP port, gRPC port, process)."""
    port, grpc_port = free_port(), free_port()
    environment = {
        **os.environ,
        "PYTRITON_TRITON_CONFIG_HTTP_PORT": str(port),
        "PYTRITON_TRITON_CONFIG_GRPC_PORT": str(grpc_port),
        "PYTRITON_TRITON_CONFIG_METRICS_PORT": str(free_port()),
        "PYTRITON_TRITON_CONFIG_HTTP_ADDRESS": "127.0.0.1",
        "PYTRITON_TRITON_CONFIG_GRPC_ADDRESS": "127.0.0.1",
        **(env or {}),
    }
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty server never blocks on it
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLES / script), *args], env=environment, stdout=log, stderr=subprocess.STDOUT
        )
        try:

            def ready() -> bool:
                assert process.poll() is None, _read(log)
                return _ready(port, model)

            wait_until(ready, 120, f"{model} ready", 0.2)
            yield port, grpc_port, process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    raise
        assert process.returncode == returncode, _read(log)


def _read(log) -> str:
    log.seek(0)
    return log.read()


def client(script: str, port: int) -> str:
    env = {**os.environ, "PYTRITON_URL": f"127.0.0.1:{port}"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def curl(*args: str) -> str:
    return subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def test_linear_quick_start():
    with example("linear_server.py", "Linear") as (port, _, _):
        assert client("linear_client.py", port).strip() == "(128, 3)"
        config = json.loads(curl(f"http://127.0.0.1:{port}/v2/models/Linear/config"))
        assert (config["backend"], config["max_batch_size"]) == ("python", 128)
        assert [i["name"] for i in config["input"]] == ["INPUT_1"]
        assert [o["name"] for o in config["output"]] == ["OUTPUT_1"]
    assert not _ready(port, "Linear")  # stopped: nothing answers on the port any more


def test_add_sub():
    with example("add_sub_server.py", "AddSub") as (port, grpc_port, _):
        out = client("add_sub_client.py", port)
        assert "add [1.5, 2.5, 3.5] sub [0.5, 1.5, 2.5]" in out
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        a = httpclient.InferInput("a", [1, 2], "FP32")
        a.set_data_from_numpy(np.array([[5, 6]], np.float32))
        b = httpclient.InferInput("b", [1, 2], "FP32")
        b.set_data_from_numpy(np.array([[1, 1]], np.float32))
        result = http.infer("AddSub", [a, b])
        assert result.as_numpy("sub").tolist() == [[4.0, 5.0]]
        http.close()
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc:
            ga = grpcclient.InferInput("a", [1, 2], "FP32")
            ga.set_data_from_numpy(np.array([[5, 6]], np.float32))
            gb = grpcclient.InferInput("b", [1, 2], "FP32")
            gb.set_data_from_numpy(np.array([[1, 1]], np.float32))
            assert grpc.infer("AddSub", [ga, gb]).as_numpy("add").tolist() == [[6.0, 7.0]]
        body = {
            "inputs": [
                {"name": "a", "shape": [1, 1], "datatype": "FP32", "data": [2]},
                {"name": "b", "shape": [1, 1], "datatype": "FP32", "data": [3]},
            ]
        }
        answer = json.loads(curl("-d", json.dumps(body), f"http://127.0.0.1:{port}/v2/models/AddSub/infer"))
        assert {o["name"]: o["data"] for o in answer["outputs"]} == {"add": [5.0], "sub": [-1.0]}


def test_strings():
    with example("strings_server.py", "Upper") as (port, _, _):
        assert client("strings_client.py", port).strip() == "['HELLO', 'WÖRLD']"
        body = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["shoal"]}]}
        answer = json.loads(curl("-d", json.dumps(body), f"http://127.0.0.1:{port}/v2/models/Upper/infer"))
        assert answer["outputs"][0]["data"] == ["SHOAL"]


def test_streaming_generator():
    with example("streaming_server.py", "Words") as (port, _, _):
        out = client("streaming_client.py", port)
        assert out.split("\n")[:4] == ["0 shoal", "1 serves", "2 python", "3 functions"]
        events = curl("-N", "-d", '{"prompt": "a b c"}', f"http://127.0.0.1:{port}/v2/models/Words/generate_stream")
        words = [json.loads(line[5:])["word"] for line in events.splitlines() if line.startswith("data:")]
        assert words == ["a", "b", "c"]


def test_streaming_over_grpc():
    with example("streaming_server.py", "Words") as (_, grpc_port, _):
        from shoal.pytriton.client import DecoupledModelClient

        with DecoupledModelClient(f"grpc://127.0.0.1:{grpc_port}", "Words", init_timeout_s=60) as grpc_client:
            prompt = np.array([b"x y"], dtype=np.object_)
            words = [r["word"][0] for r in grpc_client.infer_sample(prompt=prompt)]
        assert words == [b"x", b"y"]


def listening_ports(pids: list[int]) -> list[int]:
    """The TCP ports these processes listen on (their sockets' inodes in /proc/net/tcp*)."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    inodes.add(os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").removesuffix("]"))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def test_sigkill_of_the_binding_process_takes_its_cluster_along():
    """The embedded cluster's processes die with the process that started it even when it is
    SIGKILLed (no clean-up of its own runs): none remains, its ports are free (shared/process/lifeline.py)."""
    metrics_port = free_port()
    env = {"PYTRITON_TRITON_CONFIG_METRICS_PORT": str(metrics_port)}
    with example("linear_server.py", "Linear", env=env, returncode=-signal.SIGKILL) as (port, grpc_port, process):
        tree = descendants(process.pid)
        commands = {pid: command_of(pid) for pid in tree}
        # nats-server, repository, worker, gateway (which hosts the scheduler)
        assert len(tree) >= 4, commands
        assert any("nats-server" in command for command in commands.values()), commands
        ports = listening_ports(tree)  # HTTP, gRPC, metrics, NATS and its monitoring
        assert {port, grpc_port, metrics_port} < set(ports), ports
        process.kill()
        process.wait()
    try:
        wait_until(lambda: not [pid for pid in tree if alive(pid)], 30, "the cluster outlived the binding process")
        wait_until(lambda: not [p for p in ports if listening(p)], 30, "the cluster's ports still listening")
    finally:  # a failed test leaves nothing behind either
        for pid in tree:
            if command_of(pid) == commands[pid]:  # still that process, not a reused pid
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("endpoint", ["HTTP", "GRPC"])
def test_a_taken_port_fails_at_once_in_tritonservers_words_leaving_nothing(tmp_path, endpoint):
    """Issue 28 item 16: another process (a `shoal serve`, anything) listens on the script's port."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as holder:
        taken = holder.getsockname()[1]
        ports = {"HTTP": free_port(), "GRPC": free_port(), "METRICS": free_port(), endpoint: taken}
        environment = {
            **os.environ,
            "TMPDIR": str(temporary),  # the script's shoal-pytriton-* and shoal-nats-* directories go here
            **{f"PYTRITON_TRITON_CONFIG_{name}_PORT": str(port) for name, port in ports.items()},
            "PYTRITON_TRITON_CONFIG_HTTP_ADDRESS": "127.0.0.1",
            "PYTRITON_TRITON_CONFIG_GRPC_ADDRESS": "127.0.0.1",
        }
        run = subprocess.run(
            [sys.executable, str(EXAMPLES / "add_sub_server.py")],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,  # it hung until killed
        )
    assert run.returncode != 0
    assert f"failed to start {endpoint} service: Unavailable - Socket '127.0.0.1:{taken}' already in use" in run.stderr
    assert list(temporary.iterdir()) == []

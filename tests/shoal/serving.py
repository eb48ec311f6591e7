"""`shoal serve` as a user runs it: a subprocess on free ports, its output in a file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from onnx import TensorProto

from services.repository import examples
from shared.process.natsserver import free_port
from tests.cluster import identity_config
from tests.serving import wait_until


@dataclass
class Serve:
    process: subprocess.Popen
    log: Path
    http_port: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """The signal to the whole process group, as Ctrl-C in a terminal sends SIGINT."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def wait_for(self, text: str, timeout: float = 120.0) -> str:
        def said() -> bool:
            assert self.process.poll() is None, f"shoal serve exited:\n{self.output()}"
            return text in self.output()

        wait_until(said, timeout, f"{text!r} in the output", detail=self.output)
        return self.output()


def one_model_repository(root: Path, name: str) -> Path:
    examples.write_model(root, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32"))
    return root


ADDSUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""
CONFIG = """name: "addsub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def addsub_repository(root: Path) -> Path:
    """qa's `addsub` as a python model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [16])."""
    (root / "addsub" / "1").mkdir(parents=True)
    (root / "addsub" / "1" / "model.py").write_text(ADDSUB)
    (root / "addsub" / "config.pbtxt").write_text(CONFIG)
    return root


def status_env(cache: Path) -> dict[str, str]:
    """Every `shoal serve` and `shoal status` of a test shares one cache directory (not the user's)."""
    return {**os.environ, "XDG_CACHE_HOME": str(cache)}


@contextlib.contextmanager
def serve(
    repository: Path, cache: Path, *flags: str, stop: int = signal.SIGTERM, cwd: Path | None = None
) -> Iterator[Serve]:
    """`cwd`: where it runs (a relative `repository` is from there)."""
    http_port = free_port()
    log = (cwd or Path()) / repository.parent / f"serve-{http_port}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shoal.cli",
                "serve",
                f"--model-repository={repository}",
                f"--http-port={http_port}",
                f"--metrics-port={free_port()}",
                f"--grpc-port={free_port()}",
                "--http-address=127.0.0.1",
                *flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=status_env(cache),
            start_new_session=True,  # its own process group, as a terminal's foreground job
            cwd=cwd,
        )
    running = Serve(process, log, http_port)
    try:
        yield running
    finally:
        running.stop(stop)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

"""A 100 MB model version loaded by a worker with no copy of the repository (its files fetched from
NATS) against one reading them from local disk, and a second worker of the same host reusing the
first one's cache (issue 37; services/worker/model_files.py, docs/serving.md "Deployment").

    python benchmarks/model_files.py --mb 100 --runs 3

Real processes on one nats-server (JetStream on disk): a repository (`--model-files path`, then
`store`) and workers started one after another, each loading the model `big` (ONNX: one MatMul
with a `--mb` MB FP32 weight). A worker logs how long its load took (from the record's arrival
to READY: the fetch, then onnxruntime's session) and what it fetched; the table gives, per run:

- disk: a worker loading from the repository's directory (`--model-files path`);
- fetched: a worker with an empty cache, the files fetched from NATS and checked (SHA-256);
- cached: a second worker sharing that cache, nothing fetched;
- publish: the repository hashing and uploading the files (once per content, before any worker).

Every file read here is in the page cache (just written), both for the disk and for nats-server's
store: the figures compare the two paths' own costs, not a cold disk's. Write the load average
(`uptime`) with the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.repository import examples  # noqa: E402
from shared.process.natsserver import NatsServer  # noqa: E402
from shared.process.settings import RepositorySettings, WorkerSettings, to_argv  # noqa: E402

LOADED = re.compile(r"loaded 'big' version 1 \(generation \d+\): \d+ instance\(s\) in (\d+) ms")
FETCHED = re.compile(r"files: ([\d.]+) MiB fetched in (\d+) ms")
PUBLISHED = re.compile(r"model files of 'big': .* uploaded \(hashed in (\d+) ms, sent in (\d+) ms\)")


def write_model(root: Path, mb: int) -> int:
    side = int((mb * 1e6 / 4) ** 0.5)
    weight = np.random.default_rng(0).standard_normal((side, side), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "W"], ["OUTPUT0"])],
        "big",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", side])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", side])],
        [numpy_helper.from_array(weight, "W")],
    )
    config = (
        'name: "big"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {side} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {side} ] }} ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    examples.write_model(root, "big", graph, config)
    return (root / "big" / "1" / "model.onnx").stat().st_size


def start(kind: str, settings, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "shoal.cli", kind, *to_argv(settings)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )


def wait_for(log: Path, pattern: re.Pattern[str], timeout: float = 300) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pattern.search(log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"{pattern.pattern} not in {log}:\n{log.read_text(errors='replace')[-3000:]}")


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def worker_load(url: str, work: Path, name: str, cache: Path) -> tuple[float, float, float]:
    """(load ms, MiB fetched, fetch ms) of one worker loading `big` at its start."""
    log = work / f"{name}.log"
    process = start("worker", WorkerSettings(nats_url=url, worker_id=name, model_cache_dir=str(cache)), log)
    try:
        loaded = wait_for(log, LOADED)
        line = log.read_text(errors="replace")[loaded.start() :].split("\n", 1)[0]
        fetched = FETCHED.search(line)
        return (
            float(loaded.group(1)),
            float(fetched.group(1)) if fetched else 0.0,
            float(fetched.group(2)) if fetched else 0.0,
        )
    finally:
        stop([process])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100, help="size of the model's weight (MB)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shoal-model-files-"))
    root = work / "models"
    size = write_model(root, args.mb)
    print(f"model 'big': {size / 1e6:.1f} MB (1/model.onnx); load average {os.getloadavg()[0]:.1f}")
    rows = []
    (work / "nats").mkdir()
    with NatsServer(store_dir=str(work / "nats")) as nats:
        for run in range(args.runs):
            row: dict[str, float] = {}
            for mode in ("path", "store"):
                log = work / f"repository-{run}-{mode}.log"
                settings = RepositorySettings(nats_url=nats.url, model_repository=str(root), model_files=mode)
                repository = start("repository", settings, log)
                try:
                    if mode == "path":
                        row["disk"] = worker_load(nats.url, work, f"disk-{run}", work / f"unused-{run}")[0]
                        continue
                    # the path repository's record (no files) is still in the bucket until this one
                    # publishes: a worker started before would load from the path
                    published = wait_for(log, PUBLISHED)
                    if run == 0:
                        row["hash"], row["upload"] = float(published.group(1)), float(published.group(2))
                    cache = work / f"cache-{run}"
                    row["fetched"], mib, row["fetch"] = worker_load(nats.url, work, f"cold-{run}", cache)
                    assert mib > 0, "the cold worker fetched nothing"
                    row["cached"], again, _ = worker_load(nats.url, work, f"warm-{run}", cache)
                    assert again == 0, "the second worker fetched again"
                finally:
                    stop([repository])
            rows.append(row)
            print(
                f"run {run}: disk {row['disk']:.0f} ms, fetched {row['fetched']:.0f} ms (fetch {row['fetch']:.0f} ms)"
                f" = {row['fetched'] / row['disk']:.2f}x, cached {row['cached']:.0f} ms"
                f" = {row['cached'] / row['disk']:.2f}x; load average {os.getloadavg()[0]:.1f}"
                + (f"; publish: hashed {row['hash']:.0f} ms, uploaded {row['upload']:.0f} ms" if "hash" in row else "")
            )
    ratios = sorted(r["fetched"] / r["disk"] for r in rows)
    print(f"fetched / disk: median {ratios[len(ratios) // 2]:.2f}x (runs: {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()

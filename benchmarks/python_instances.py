#!/usr/bin/env python3
"""Python models' instances: parallelism, CPU and memory against Triton's stubs (issue 33).

    python benchmarks/python_instances.py [--rounds 2] [--concurrency 4] [--iterations 15000]
                                          [--cpu-concurrency 16] [--idle 40] [--out DIR]
                                          [--shoal-cmd "shoal"] [--only throughput,cpu,memory,idle]

One run, both servers up at once on the same repository (the anchor environment of
benchmarks/vs_triton.py: the real tritonserver 2.51 and perf_analyzer, installed by
../shared/bench/setup_triton.sh when missing), every case Triton then Shoal, `--rounds` times:

- **throughput**: `py_loop_1` and `py_loop_2`, a `model.py` whose `execute` is a pure Python loop
  (`--iterations` of it: about 1.5 ms on the 2-core VM, no numpy, the GIL held throughout),
  `max_batch_size: 0`, one and two instances; perf_analyzer at `--concurrency` over HTTP. Prints
  infer/s, each server's count-2 ÷ count-1 ratio, and Shoal ÷ Triton;
- **cpu**: CPU µs per request of each process (Triton's stub and Shoal's python model process
  above all) on `simple` (python add/sub, batch 1) at `--cpu-concurrency`, from /proc over a fixed
  span (`vs_triton.cpu_per_request`);
- **memory**: the resident and proportional set sizes (RSS, PSS: /proc/PID/smaps_rollup) of each
  idle python model process: Triton's `triton_python_backend_stub`s and Shoal's instance processes;
- **idle**: `--idle` copies of `py_loop_1` loaded in Shoal alone, and the CPU every process of
  `shoal serve` takes over 30 s with no request (% of one core).

The load average is printed beside every figure: a benchmark taken on a busy machine is noise, and
only ratios from one run count. Results go to DIR/python_instances.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_triton import Shoal, Triton, cpu_per_request, cpu_s, label, log, pa_once, tree  # noqa: E402

HERE = Path(__file__).resolve().parent
LOOP_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

ITERATIONS = {iterations}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            acc = 0
            for i in range(ITERATIONS):  # pure Python: the GIL is held the whole time
                acc = (acc + i * x) % 1000003
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", np.array([acc], dtype=np.int32))]))
        return responses
"""
LOOP_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def write_loop(repo: Path, name: str, count: int, iterations: int) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(LOOP_PY.format(iterations=iterations)))
    (repo / name / "config.pbtxt").write_text(LOOP_CONFIG.format(name=name, count=count))


def write_repository(out: Path, anchor_python: str, iterations: int) -> Path:
    """`simple` from benchmarks/triton_models.py (python add/sub), and the two loop models."""
    subprocess.run([anchor_python, str(HERE / "triton_models.py"), str(out)], check=True, stdout=sys.stderr)
    repo = out / "repo"
    for extra in [p for p in repo.iterdir() if p.name != "simple"]:
        shutil.rmtree(extra)
    write_loop(repo, "py_loop_1", 1, iterations)
    write_loop(repo, "py_loop_2", 2, iterations)
    return repo


def memory(pid: int) -> dict[str, int]:
    """RSS and PSS in KiB (the PSS shares each page among the processes mapping it)."""
    found = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Rss", "Pss"):
            found[key.lower() + "_kib"] = int(value.split()[0])
    return found


def model_processes(root: int) -> list[int]:
    return [p for p in tree(root) if label(p) in ("triton_python_backend_stub", "worker (python model child)")]


def summarise(samples: list[dict[str, int]]) -> dict[str, float]:
    keys = samples[0] if samples else {}
    return {
        **{f"mean_{k}": round(sum(s[k] for s in samples) / len(samples)) for k in keys},
        **{f"min_{k}": min(s[k] for s in samples) for k in keys},
        **{f"max_{k}": max(s[k] for s in samples) for k in keys},
        "processes": len(samples),
    }


def idle_cpu(shoal_cmd: list[str], out: Path, models: int, iterations: int, seconds: float) -> dict:
    """`models` python models loaded, no request: the CPU every process of `shoal serve` takes."""
    repo = out / "idle_repo"
    shutil.rmtree(repo, ignore_errors=True)
    for i in range(models):
        write_loop(repo, f"idle_{i}", 1, iterations)
    shoal = Shoal(shoal_cmd, repo, out / "shoal_idle.log", None)
    try:
        shoal.start([f"idle_{i}" for i in range(models)], timeout=900)
        assert shoal.proc is not None
        time.sleep(10)  # the loads' aftermath settles
        pids = tree(shoal.proc.pid)
        before, started, load = {p: cpu_s(p) for p in pids}, time.monotonic(), load_average()
        time.sleep(seconds)
        used = sum(cpu_s(p) - before[p] for p in pids)
        span = time.monotonic() - started
        by_kind: dict[str, float] = {}
        for p in pids:
            by_kind[label(p) or "?"] = by_kind.get(label(p) or "?", 0.0) + cpu_s(p) - before[p]
        return {
            "models": models,
            "processes": len(pids),
            "cpu_pct_of_one_core": round(100 * used / span, 2),
            "by_process_kind_pct": {k: round(100 * v / span, 2) for k, v in sorted(by_kind.items())},
            "load_average": f"{load} -> {load_average()}",
        }
    finally:
        shoal.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--cpu-concurrency", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=15000, help="of the loop model's Python loop per request")
    ap.add_argument("--idle", type=int, default=40, help="python models loaded for the idle figure")
    ap.add_argument("--idle-seconds", type=float, default=30)
    ap.add_argument("--cpu-seconds", type=int, default=10)
    ap.add_argument("--only", default="throughput,cpu,memory,idle")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "python_instances")
    ap.add_argument("--shoal-cmd", default="shoal")
    ap.add_argument("--anchor-venv", type=Path, default=Path(os.environ.get("ANCHOR_VENV", "/tmp/anchor-venv")))
    ap.add_argument(
        "--setup-script",
        default=os.environ.get("SHOAL_BENCH_SETUP", str(HERE.parent.parent / "shared" / "bench" / "setup_triton.sh")),
    )
    args = ap.parse_args()
    only = set(args.only.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    shoal_cmd = shlex.split(args.shoal_cmd)
    result: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "rounds": []}
    pa = str(args.anchor_venv / "bin" / "pa")
    if only & {"throughput", "cpu", "memory"}:
        if not Path(pa).exists():
            subprocess.run(
                ["bash", args.setup_script], check=True, env=dict(os.environ, ANCHOR_VENV=str(args.anchor_venv))
            )
        repo = write_repository(args.out, str(args.anchor_venv / "bin" / "python"), args.iterations)
        triton = Triton(args.anchor_venv, repo, args.out / "triton-rt")
        shoal = Shoal(shoal_cmd, repo, args.out / "shoal.log", None)
        triton.start()
        try:
            shoal.start(["simple", "py_loop_1", "py_loop_2"])
            assert shoal.proc is not None
            servers = {
                "triton": (f"127.0.0.1:{triton.http}", triton.pid),
                "shoal": (f"127.0.0.1:{shoal.http}", shoal.proc.pid),
            }
            if "memory" in only:
                time.sleep(5)  # idle
                result["memory"] = {
                    name: {**summarise([memory(p) for p in model_processes(root)]), "load_average": load_average()}
                    for name, (_, root) in servers.items()
                }
                zygotes = [memory(p) for p in tree(shoal.proc.pid) if label(p) == "worker (zygote)"]
                if zygotes:  # what the processes fork from: one per worker, shared by all its python models
                    result["memory"]["shoal zygote"] = summarise(zygotes)
                log("memory:", json.dumps(result["memory"]))
            for round_ in range(args.rounds):
                row: dict = {}
                for model in ("py_loop_1", "py_loop_2") if "throughput" in only else ():
                    for name, (url, _) in servers.items():
                        load = load_average()
                        figure = pa_once(pa, url, model, args.concurrency, ["--shape", "INPUT0:1"], "http", False)
                        row[f"{name} {model}"] = {**figure, "load_average": f"{load} -> {load_average()}"}
                        log(f"round {round_ + 1} {name} {model}:", json.dumps(row[f"{name} {model}"]))
                for name, (url, root) in servers.items() if "cpu" in only else ():
                    load = load_average()
                    figure = cpu_per_request(pa, url, "simple", args.cpu_concurrency, root, [], args.cpu_seconds)
                    row[f"{name} simple cpu"] = {**figure, "load_average": f"{load} -> {load_average()}"}
                    log(f"round {round_ + 1} {name} simple cpu:", json.dumps(row[f"{name} simple cpu"]))
                result["rounds"].append(row)
        finally:
            shoal.stop()
            triton.stop()
    if "idle" in only:
        result["idle"] = idle_cpu(shoal_cmd, args.out, args.idle, args.iterations, args.idle_seconds)
        log("idle:", json.dumps(result["idle"]))
    (args.out / "python_instances.json").write_text(json.dumps(result, indent=1))
    print(render(result))
    return 0


def render(result: dict) -> str:
    lines = []
    for i, row in enumerate(result["rounds"], 1):
        t1, t2 = (row.get(f"triton py_loop_{c}", {}).get("throughput") for c in (1, 2))
        s1, s2 = (row.get(f"shoal py_loop_{c}", {}).get("throughput") for c in (1, 2))
        if t1 and t2 and s1 and s2:
            lines.append(
                f"round {i}: infer/s Triton {t1:.0f} (count 1), {t2:.0f} (count 2): x{t2 / t1:.2f}; "
                f"Shoal {s1:.0f}, {s2:.0f}: x{s2 / s1:.2f}; Shoal/Triton {s1 / t1:.2f} (count 1), {s2 / t2:.2f} "
                f"(count 2); Shoal's scaling / Triton's {(s2 / s1) / (t2 / t1):.2f}"
            )
        cpu = {k: row.get(f"{k} simple cpu", {}).get("us_per_request", {}) for k in ("triton", "shoal")}
        stub, child = cpu["triton"].get("triton_python_backend_stub"), cpu["shoal"].get("worker (python model child)")
        if stub and child:
            lines.append(
                f"round {i}: simple, CPU us/request: Triton's stub {stub}, Shoal's python model process {child}: x{child / stub:.2f}"
            )
    for name, figures in result.get("memory", {}).items():
        lines.append(f"memory {name}: {json.dumps(figures)}")
    if "idle" in result:
        lines.append(f"idle: {json.dumps(result['idle'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

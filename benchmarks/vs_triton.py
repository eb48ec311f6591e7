#!/usr/bin/env python3
"""Shoal against the real Triton, side by side, in one run (issue 19's benchmark).

usage: python benchmarks/vs_triton.py [--quick] [--cases simple_c1,mlp_py_c16,...] [--grpc]
                                      [--str [--str-rounds N]] [--out DIR] [--shoal-cmd 'shoal']
                                      [--setup-script PATH]

What it does, in one run on this machine:
  1. makes sure the anchor environment exists (real tritonserver 2.51 + perf_analyzer 2.41 from
     wheels): runs the setup script (`--setup-script`, env SHOAL_BENCH_SETUP, default
     ../shared/bench/setup_triton.sh relative to the repository) when `$ANCHOR_VENV/bin/pa` is missing;
  2. writes the benchmark models (benchmarks/triton_models.py, one onnxruntime thread);
  3. starts Triton (benchmarks/triton.sh) and Shoal (`shoal serve`, found on PATH or `--shoal-cmd`,
     never imported) on free ports, both up at once, on the same python-backend models; Shoal's
     repository also holds the native onnxruntime `mlp_onnx` (symlinks to the same directories);
  4. measures every case Triton, Shoal, Triton, Shoal with perf_analyzer (HTTP; gRPC too with
     `--grpc`: `shoal serve` opens gRPC on a free port, or `--shoal-grpc-port`), so drift hits both alike;
  5. CPU µs per request for every process of each server at c=16 (mlp and simple), and the design
     floor (benchmarks/hops.py: TCP echo, bare uvicorn, nats-py 2/3-hop relays);
  5d. with `--str`: the text-recognition tutorial's table (benchmarks/str_table.py): its STR model
     swept with `-b 2 --shape input.1:1,32,100 --concurrency-range 2:16:2` in its three
     configurations, on Triton, on Shoal with the same model.py, and on Shoal's native backend;
  6. MLServer, the Python peer (skip with `--no-mlserver`): its own venv (benchmarks/setup_mlserver.sh,
     `--mlserver-venv`), the same identity and MLP (benchmarks/mlserver_models.py, adaptive batching),
     and the three servers measured alike with wrk on plain V2 JSON requests, which is all MLServer
     reads (benchmarks/mlserver_peer.py);
  7. prints a markdown table (each figure, Shoal/Triton ratio = median over the two pairs) and
     writes DIR/vs_triton.json with the raw numbers.
Ratios within one run are what count: the machine is shared and absolute numbers move.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import mlserver_peer  # benchmarks/: this script's directory is first on sys.path
import str_table

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
TICK = os.sysconf("SC_CLK_TCK")

# name -> (triton model, shoal model, concurrency, metric, perf_analyzer extra args)
CASES = {
    "simple_c1": ("simple", "simple", 1, "p50_us", []),
    "simple_c16": ("simple", "simple", 16, "throughput", []),
    "identity_c16": ("identity_fp32", "identity_fp32", 16, "throughput", ["--shape", "INPUT0:16"]),
    "mlp_py_c16": ("mlp_onnx_py", "mlp_onnx_py", 16, "throughput", []),
    "mlp_native_c16": ("mlp_onnx_py", "mlp_onnx", 16, "throughput", []),
}
CPU_CASES = {"mlp_native_c16": CASES["mlp_native_c16"], "simple_c16": CASES["simple_c16"]}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def http_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


# ------------------------------------------------------------------ perf_analyzer, once
def pa_once(pa: str, url: str, model: str, conc: int, extra: list[str], protocol: str, quick: bool) -> dict:
    """One stable perf_analyzer measurement (median of the stable windows)."""
    window = "1000" if quick else "3000"
    err = ""
    for stability in ("15", "40", "100"):  # a noisy shared machine: wider windows on each retry (100: any)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.csv")
            cmd = [
                pa,
                "-m",
                model,
                "-u",
                url,
                "-i",
                protocol,
                "--concurrency-range",
                f"{conc}:{conc}",
                "-p",
                window,
                "-s",
                stability,
                "-r",
                "5" if quick else "10",
                "-f",
                out,
                *extra,
            ]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            except subprocess.TimeoutExpired:
                err = "timeout"
                continue
            if r.returncode == 0 and os.path.exists(out):
                row = next(csv.DictReader(open(out)))
                return {
                    "throughput": float(row["Inferences/Second"]),
                    "p50_us": float(row["p50 latency"]),
                    "p95_us": float(row["p95 latency"]),
                    "p99_us": float(row["p99 latency"]),
                    "stability_pct": int(stability),
                }
            err = (r.stderr or r.stdout).strip()[-300:]
    return {"error": err}


# ------------------------------------------------------------------ CPU per request
def tree(root_pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [root_pid], [root_pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def label(pid: int) -> str | None:
    try:
        args = open(f"/proc/{pid}/cmdline").read().split("\0")
    except OSError:
        return None
    exe = os.path.basename(args[0])
    if exe in ("tritonserver", "triton_python_backend_stub", "nats-server", "perf_analyzer"):
        return exe
    try:  # a python model's process names itself `py<i>:<model>` (a forked one has its zygote's argv)
        comm = open(f"/proc/{pid}/comm").read()
    except OSError:
        return None
    if comm.startswith("py") and ":" in comm:
        return "worker (python model child)"
    if "services.worker.python.processes.zygote" in args:
        return "worker (zygote)"
    words = args[:6]
    for word in ("gateway", "scheduler", "repository", "worker", "serve"):  # shoal's services
        if word in words:
            if word == "worker" and "--models" in args:
                return "worker (python model child)"
            return word
    return exe or None


def cpu_s(pid: int) -> float:
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError):
        return 0.0


def served(http: str, model: str) -> int:
    stats = http_json(f"http://{http}/v2/models/{model}/stats", timeout=10)
    return sum(m["inference_count"] for m in stats["model_stats"])


def cpu_per_request(pa: str, http: str, model: str, conc: int, root: int, extra: list[str], secs: int) -> dict:
    pids = tree(root)
    names = {p: label(p) for p in pids}
    n0 = served(http, model)
    before = {p: cpu_s(p) for p in pids}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.csv")
        cmd = [
            pa,
            "-m",
            model,
            "-u",
            http,
            "-i",
            "http",
            "--concurrency-range",
            f"{conc}:{conc}",
            "-p",
            str(secs * 1000),
            "-s",
            "100",
            "-r",
            "3",
            "-f",
            out,
            *extra,
        ]  # a fixed span: CPU and
        # requests are counted over the same span, so stability is not needed here
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        after = {p: cpu_s(p) for p in pids}
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = list(csv.DictReader(open(out))) if os.path.exists(out) else []
    requests = served(http, model) - n0
    if not rows or requests <= 0:
        return {"error": (proc.stderr or proc.stdout)[-300:]}
    by: dict[str, float] = {}
    for p in pids:
        if names[p]:
            by[names[p]] = by.get(names[p], 0.0) + after.get(p, 0.0) - before.get(p, 0.0)
    by["perf_analyzer (client)"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    us = {k: round(v / requests * 1e6, 1) for k, v in by.items()}
    us["total"] = round(sum(by.values()) / requests * 1e6, 1)
    us["total server"] = round(us["total"] - us["perf_analyzer (client)"], 1)
    return {"throughput": float(rows[0]["Inferences/Second"]), "requests": requests, "us_per_request": us}


# ------------------------------------------------------------------ servers
class Triton:
    def __init__(self, venv: Path, repo: Path, rt: Path) -> None:
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self.env = dict(os.environ, ANCHOR_VENV=str(venv), ANCHOR_RT=str(rt))
        self.repo, self.rt, self.pid = repo, rt, 0

    def start(self) -> None:
        subprocess.run(
            [
                "bash",
                str(HERE / "triton.sh"),
                "start",
                str(self.repo),
                "--http-port",
                str(self.http),
                "--grpc-port",
                str(self.grpc),
                "--metrics-port",
                str(self.metrics),
            ],
            env=self.env,
            check=True,
            stdout=sys.stderr,
        )
        self.pid = int((self.rt / "tritonserver.pid").read_text())

    def stop(self) -> None:
        subprocess.run(["bash", str(HERE / "triton.sh"), "stop"], env=self.env, stdout=sys.stderr)


class Shoal:
    def __init__(self, cmd: list[str], repo: Path, logfile: Path, grpc_port: int | None) -> None:
        self.http, self.metrics, self.monitor = free_port(), free_port(), free_port()
        self.grpc = grpc_port or free_port()  # never Triton's default 8001, which another server may hold
        self.cmd = [
            *cmd,
            "serve",
            "--model-repository",
            str(repo),
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(self.http),
            "--metrics-port",
            str(self.metrics),
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(self.grpc),
            "--nats-monitor-port",
            str(self.monitor),
        ]
        self.logfile = logfile
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []

    def start(self, models: list[str], timeout: float = 240) -> None:
        log("starting:", shlex.join(self.cmd))
        self.proc = subprocess.Popen(
            self.cmd, stdout=open(self.logfile, "w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"shoal serve exited ({self.proc.returncode}); log: {self.logfile}")
            try:
                if all(
                    urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/models/{m}/ready", timeout=2).status == 200
                    for m in models
                ):
                    self.pids = tree(self.proc.pid)
                    log(f"shoal ready: pid {self.proc.pid} http=127.0.0.1:{self.http} nats monitor={self.monitor}")
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"shoal not ready after {timeout:.0f} s; log: {self.logfile}")

    def stop(self) -> list[int]:
        """SIGINT, wait; escalate only if it hangs. Returns any process of its tree still alive."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        self.pids = sorted(set(self.pids) | set(tree(self.proc.pid)))
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            log("shoal did not stop within 60 s of SIGINT: SIGTERM")
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.5)
        return [
            p
            for p in self.pids
            if os.path.exists(f"/proc/{p}")
            and label(p) is not None
            and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        ]


# ------------------------------------------------------------------ main
def ratio(case_metric: str, t: list[float], s: list[float]) -> float | None:
    pairs = [b / a for a, b in zip(t, s) if a and b]
    return round(statistics.median(pairs), 3) if pairs else None


def fmt(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter windows, one CPU pass (under ~4 min)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)} (default all)")
    ap.add_argument("--grpc", action="store_true", help="also measure over gRPC (perf_analyzer -i grpc, unary)")
    ap.add_argument("--shoal-grpc-port", type=int, default=None, help="Shoal's gRPC port (default: a free one)")
    ap.add_argument("--shoal-cmd", default=os.environ.get("SHOAL_CMD", "shoal"), help="how to run Shoal's CLI")
    ap.add_argument(
        "--setup-script",
        default=os.environ.get("SHOAL_BENCH_SETUP", str(REPO_ROOT.parent / "shared/bench/setup_triton.sh")),
    )
    ap.add_argument("--anchor-venv", default=os.environ.get("ANCHOR_VENV", "/tmp/anchor-venv"))
    ap.add_argument("--out", default=None, help="results directory (default bench-out/vs_triton-<time>)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU-per-request pass")
    ap.add_argument("--no-hops", action="store_true", help="skip the design-floor pass")
    ap.add_argument("--keep-models", default=None, help="reuse/keep the model directory here")
    ap.add_argument("--no-mlserver", action="store_true", help="skip MLServer (the Python peer)")
    ap.add_argument("--mlserver-venv", default=os.environ.get("MLSERVER_VENV", "/tmp/mlserver-venv"))
    ap.add_argument("--str", action="store_true", help="also the text-recognition tutorial's table (~9 min a round)")
    ap.add_argument("--str-rounds", type=int, default=1, help="rounds of the text-recognition sweeps (default 1)")
    args = ap.parse_args()

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    out = Path(args.out or REPO_ROOT / "bench-out" / f"vs_triton-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    venv = Path(args.anchor_venv)
    pa = venv / "bin" / "pa"
    shoal_cmd = shlex.split(args.shoal_cmd)
    if not shutil.which(shoal_cmd[0]):
        sys.exit(f"'{shoal_cmd[0]}' not found on PATH (activate Shoal's venv or pass --shoal-cmd)")
    t_start = time.monotonic()

    # 1. the anchor environment
    if not pa.exists():
        log("anchor env missing: running", args.setup_script)
        subprocess.run(
            ["bash", args.setup_script], env=dict(os.environ, ANCHOR_VENV=str(venv)), check=True, stdout=sys.stderr
        )
    mlserver_venv = Path(args.mlserver_venv)
    if not args.no_mlserver:
        subprocess.run(
            ["bash", str(HERE / "setup_mlserver.sh")],
            env=dict(os.environ, MLSERVER_VENV=str(mlserver_venv)),
            check=True,
            stdout=sys.stderr,
        )

    # 2. models (one onnxruntime thread, one instance, as Triton is given)
    work = Path(tempfile.mkdtemp(prefix="vs_triton-"))  # models, Shoal's repository, Triton's runtime copy
    models = Path(args.keep_models).resolve() if args.keep_models else work / "models"
    have_str = (models / "repo" / "text_recognition_py").exists()
    if not (models / "repo" / "simple").exists() or (args.str and not have_str):
        subprocess.run(
            [str(venv / "bin" / "python"), str(HERE / "triton_models.py"), str(models), "--ort-threads", "1"]
            + (["--str"] if args.str else []),
            check=True,
            stdout=sys.stderr,
        )
    # Shoal's repository: the same model files (hard links; Shoal refuses symlinks leading out of
    # its repository) plus the native onnxruntime mlp_onnx, so one `shoal serve` serves all cases
    shoal_repo = work / "shoal_repo"
    shutil.rmtree(shoal_repo, ignore_errors=True)
    shoal_repo.mkdir()
    for d in [*(models / "repo").iterdir(), *(models / "native_repo").iterdir()]:
        shutil.copytree(d, shoal_repo / d.name, copy_function=_link_or_copy)

    result: dict = {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick,
        "host": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "cases": {},
        "cpu": {},
        "hops": None,
        "json_cases": {},
        "str": None,
    }
    triton = Triton(venv, models / "repo", work / "triton-rt")
    shoal = Shoal(shoal_cmd, shoal_repo, out / "shoal.log", args.shoal_grpc_port)
    mlserver = None
    if not args.no_mlserver:
        mlserver_models = work / "mlserver_models"
        subprocess.run(
            [sys.executable, str(HERE / "mlserver_models.py"), str(models / "mlp.onnx"), str(mlserver_models)],
            check=True,
        )
        ports = (free_port(), free_port(), free_port())
        mlserver = mlserver_peer.MLServer(mlserver_venv, mlserver_models, ports, out / "mlserver.log")
    leftovers: list[int] = []
    try:
        triton.start()
        shoal.start(
            ["simple", "identity_fp32", "mlp_onnx_py", "mlp_onnx"] + (str_table.models(True) if args.str else [])
        )
        if mlserver is not None:
            mlserver.start(list({m for m, _ in mlserver_peer.JSON_CASES.values()}))
        result["shoal_cmd"] = shoal.cmd
        protocols = ["http"] + (["grpc"] if args.grpc else [])
        shoal_grpc = port_open(shoal.grpc)
        if args.grpc and not shoal_grpc:
            log(f"--grpc: Shoal answers on no gRPC port ({shoal.grpc}): gRPC measured for Triton only")
        url = {
            ("triton", "http"): f"127.0.0.1:{triton.http}",
            ("triton", "grpc"): f"127.0.0.1:{triton.grpc}",
            ("shoal", "http"): f"127.0.0.1:{shoal.http}",
            ("shoal", "grpc"): f"127.0.0.1:{shoal.grpc}",
        }

        # warm-up: one short run per model on each server (model load, first-batch effects)
        for c in cases:
            tm, sm, _, _, extra = CASES[c]
            for server, m in (("triton", tm), ("shoal", sm)):
                subprocess.run(
                    [
                        str(pa),
                        "-m",
                        m,
                        "-u",
                        url[(server, "http")],
                        "--concurrency-range",
                        "4:4",
                        "-p",
                        "500",
                        "-r",
                        "2",
                        "-s",
                        "90",
                        *extra,
                    ],
                    capture_output=True,
                    timeout=60,
                )

        # 3. the cases, interleaved
        for proto in protocols:
            for c in cases:
                tm, sm, conc, metric, extra = CASES[c]
                runs = {"triton": [], "shoal": []}
                for server in ("triton", "shoal", "triton", "shoal"):
                    if server == "shoal" and proto == "grpc" and not shoal_grpc:
                        continue
                    m = tm if server == "triton" else sm
                    r = pa_once(str(pa), url[(server, proto)], m, conc, extra, proto, args.quick)
                    runs[server].append(r)
                    log(f"{proto} {c} {server}: {r}")
                key = c if proto == "http" else f"{c}_grpc"
                t = [r.get(metric) for r in runs["triton"]]
                s = [r.get(metric) for r in runs["shoal"]]
                result["cases"][key] = {
                    "triton_model": tm,
                    "shoal_model": sm,
                    "concurrency": conc,
                    "metric": metric,
                    "protocol": proto,
                    "triton": runs["triton"],
                    "shoal": runs["shoal"],
                    "ratio_shoal_over_triton": ratio(metric, t, s),
                }

        # 5d. the text-recognition tutorial's table
        if args.str:
            urls = {"triton": url[("triton", "http")], "shoal": url[("shoal", "http")]}

            def once(u: str, m: str, conc: int, extra: list[str]) -> dict:
                return pa_once(str(pa), u, m, conc, extra, "http", args.quick)

            result["str"] = str_table.measure(str(pa), once, urls, args.str_rounds, log)

        # 5a. CPU per request per process, c=16, Triton/Shoal/Triton/Shoal (one pair in --quick)
        if not args.no_cpu:
            order = ("triton", "shoal") if args.quick else ("triton", "shoal", "triton", "shoal")
            for c, (tm, sm, conc, _, extra) in CPU_CASES.items():
                runs = {"triton": [], "shoal": []}
                for server in order:
                    root, http, m = (
                        (triton.pid, url[("triton", "http")], tm)
                        if server == "triton"
                        else (shoal.proc.pid, url[("shoal", "http")], sm)
                    )
                    r = cpu_per_request(str(pa), http, m, conc, root, extra, 2 if args.quick else 3)
                    runs[server].append(r)
                    log(f"cpu {c} {server}: {r}")
                result["cpu"][c] = runs

        # 6. MLServer beside both, plain V2 JSON requests from wrk
        if mlserver is not None:
            assert shoal.proc is not None and mlserver.proc is not None
            servers = {
                "triton": (triton.http, triton.pid),
                "shoal": (shoal.http, shoal.proc.pid),
                "mlserver": (mlserver.http, mlserver.proc.pid),
            }
            tree_cpu = lambda root: sum(cpu_s(p) for p in tree(root))  # noqa: E731
            result["json_cases"] = mlserver_peer.measure(servers, args.quick, tree_cpu)

        # 5b. NATS messages per request (nats-server /varz around a known number of requests)
        try:
            v0 = http_json(f"http://127.0.0.1:{shoal.monitor}/varz")
            n0 = served(url[("shoal", "http")], "simple")
            subprocess.run(
                [
                    str(pa),
                    "-m",
                    "simple",
                    "-u",
                    url[("shoal", "http")],
                    "--concurrency-range",
                    "1:1",
                    "-p",
                    "1000",
                    "-r",
                    "2",
                    "-s",
                    "90",
                ],
                capture_output=True,
                timeout=60,
            )
            v1 = http_json(f"http://127.0.0.1:{shoal.monitor}/varz")
            n = served(url[("shoal", "http")], "simple") - n0
            result["nats_msgs_per_request_c1_simple"] = {
                "requests": n,
                "in_msgs": round((v1["in_msgs"] - v0["in_msgs"]) / n, 2),
                "out_msgs": round((v1["out_msgs"] - v0["out_msgs"]) / n, 2),
                "in_bytes": round((v1["in_bytes"] - v0["in_bytes"]) / n),
            }
        except Exception as exc:  # monitoring moved: not fatal
            result["nats_msgs_per_request_c1_simple"] = {"error": str(exc)}
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave servers behind
        log("stopping shoal (SIGINT) and triton")
        leftovers = shoal.stop()
        triton.stop()
        if mlserver is not None:
            mlserver.stop()
        if (work / "triton-rt" / "tritonserver.log").exists():
            shutil.copy(work / "triton-rt" / "tritonserver.log", out / "tritonserver.log")
        shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if leftovers:
        log(f"WARNING: processes of shoal still alive after stop: {leftovers}")
    result["leftover_pids"] = leftovers

    # 5c. design floor, servers down (so it does not compete with them)
    if not args.no_hops:
        nats_bin = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
        r = subprocess.run(
            [sys.executable, str(HERE / "hops.py"), nats_bin, "1500" if args.quick else "3000"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        hops = {}
        for line in r.stdout.splitlines():
            name, _, rest = line.partition(" p50 ")
            if rest:
                hops[name.strip()] = float(rest.split()[0])
        result["hops"] = hops or {"error": r.stderr[-300:]}

    result["elapsed_s"] = round(time.monotonic() - t_start)
    result["host"]["loadavg_end"] = os.getloadavg()
    (out / "vs_triton.json").write_text(json.dumps(result, indent=2))
    print(render(result))
    (out / "vs_triton.md").write_text(render(result))
    log(f"wrote {out / 'vs_triton.json'} ({result['elapsed_s']} s)")
    return 1 if leftovers else 0


def render(result: dict) -> str:
    lines = [
        f"Shoal vs Triton 2.51, {result['started']}, {'quick' if result['quick'] else 'default'} mode, "
        f"{result['host']['cpus']} CPUs, load {result['host']['loadavg_start'][0]:.1f}",
        "",
        "| case | metric | Triton run 1, 2 | Shoal run 1, 2 | Shoal/Triton |",
        "|---|---|---|---|---|",
    ]
    for key, c in result["cases"].items():
        m = c["metric"]
        t = ", ".join(fmt(r.get(m)) for r in c["triton"]) or "n/a"
        s = ", ".join(fmt(r.get(m)) for r in c["shoal"]) or "n/a"
        what = f"{key} ({c['triton_model']} vs {c['shoal_model']}, c={c['concurrency']}, {c['protocol']})"
        unit = "p50 µs (lower is better)" if m == "p50_us" else "infer/s"
        lines.append(f"| {what} | {unit} | {t} | {s} | {fmt(c['ratio_shoal_over_triton'])}× |")
    for c, runs in result["cpu"].items():
        lines += ["", f"CPU µs per request, {c} (mean of runs):", "", "| process | Triton | Shoal |", "|---|---|---|"]

        def mean(server, runs=runs):
            acc: dict[str, list[float]] = {}
            for r in runs[server]:
                for k, v in r.get("us_per_request", {}).items():
                    acc.setdefault(k, []).append(v)
            return {k: sum(v) / len(v) for k, v in acc.items()}

        t, s = mean("triton"), mean("shoal")
        keys = sorted((set(t) | set(s)) - {"total", "total server"}, key=lambda k: -(s.get(k, 0) + t.get(k, 0)))
        for k in keys + ["total server", "total"]:
            lines.append(f"| {k} | {fmt(t.get(k))} | {fmt(s.get(k))} |")

        def thr(server, runs=runs):
            rows = [r["throughput"] for r in runs[server] if "throughput" in r]
            return statistics.mean(rows) if rows else None

        lines.append(f"| (throughput during the pass, infer/s) | {fmt(thr('triton'))} | {fmt(thr('shoal'))} |")
    lines += mlserver_peer.render(result.get("json_cases", {}))
    if result.get("str"):
        lines += str_table.render(result["str"], fmt)
    msgs = result.get("nats_msgs_per_request_c1_simple")
    if msgs:
        lines += ["", f"NATS messages per request (simple, c=1, nats-server /varz): {msgs}"]
    hops = result.get("hops")
    if hops and "error" not in hops:
        lines += ["", "Design floor (p50 µs, c=1): " + ", ".join(f"{k}: {v:.0f}" for k, v in hops.items())]
        c1 = result["cases"].get("simple_c1")
        floor = hops.get("uvicorn bare HTTP answer", 0) + hops.get("nats 3 hops (A->B->C->A)", 0)
        shoal_p50 = [r.get("p50_us") for r in (c1 or {}).get("shoal", []) if r.get("p50_us")]
        if shoal_p50 and floor:
            lines.append(
                f"Shoal simple c=1 p50 / floor (bare uvicorn + nats 3-hop relay = {floor:.0f} µs): "
                f"{statistics.median(shoal_p50) / floor:.2f}×"
            )
    elif hops:
        lines += ["", f"hops failed: {hops['error']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Shoal's throughput against the number of workers on one host (issue 19, target "Scale").

usage: python benchmarks/scale.py [--workers 1,2,4,6] [--gateways same,1] [--models identity_fp32,mlp_onnx]
                                  [--seconds 8] [--per-worker-concurrency 16] [--cores-per-worker 2]
                                  [--client-cores 4] [--no-pin] [--pa PATH] [--shoal-cmd 'shoal'] [--out DIR]

For each N in --workers and each gateway count G in --gateways ("same": G = N; a number: that many):
  1. starts `shoal serve --workers N --gateways G` (free ports) pinned with `taskset` to N × 2 cores
     (--cores-per-worker), so a 16-core host emulates the "N workers on N×2 cores" host of the issue;
     every Shoal process (gateways, scheduler, workers, python model children, repository, the
     embedded nats-server) shares those cores;
  2. puts each model under perf_analyzer load (HTTP, concurrency = 16 × N) from the last
     --client-cores cores, disjoint from Shoal's, so the client never takes the server's CPU;
  3. after a warm-up, counts the requests the server answered (`/v2/models/M/stats`) and reads every
     process's CPU time (/proc) over the same span: throughput, CPU µs per request per role, and each
     process's utilisation (% of one core), so the process that saturates first is visible.
Models (benchmarks/triton_models.py, one instance per worker, one onnxruntime thread):
  identity_fp32  python backend, dynamic batching, 16 floats per request (the Python-heavy path);
  mlp_onnx       native onnxruntime MLP 256-1024-1024-16, dynamic batching (real compute per batch).
With --triton, the real Triton 2.51 (the anchor environment of benchmarks/vs_triton.py; --setup-script
installs it when missing) serves the same models on the same host after Shoal's runs: for each N, one
tritonserver pinned to the same N × 2 cores with N instances of each model (Shoal: N workers of one
instance each), under the same perf_analyzer load; its python `mlp_onnx_py` stands in for Shoal's native
`mlp_onnx`, as in vs_triton.py. The table then has a "server" column and Shoal ÷ Triton per N (issue 35
item 4: is Shoal on one big host ahead of Triton on it).
Prints a markdown table and writes DIR/scale.json and DIR/scale.md (default benchmarks/results/scale).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from vs_triton import Shoal, Triton, _link_or_copy, cpu_s, label, log, served, tree  # noqa: E402

MODELS = {"identity_fp32": ["--shape", "INPUT0:16"], "mlp_onnx": []}
TRITON_MODEL = {"identity_fp32": "identity_fp32", "mlp_onnx": "mlp_onnx_py"}  # Triton's python MLP for the native one


@dataclass(frozen=True)
class Config:
    workers: int
    gateways: int
    server_cpus: str  # taskset list, "" when not pinned
    client_cpus: str
    concurrency: int


def cpu_list(cpus: range) -> str:
    return f"{cpus.start}-{cpus.stop - 1}" if len(cpus) > 1 else str(cpus.start)


def plan(
    workers: list[int],
    gateways: list[str],
    per_worker: int,
    cores_per_worker: int,
    client_cores: int,
    total: int | None,
) -> list[Config]:
    """The (N, G) runs in order, each with its cores (`total`: the host's cores to pin to, None: no
    pinning); refuses pinning that does not fit: the client must never share Shoal's cores."""
    out: list[Config] = []
    for n in workers:
        server, client = "", ""
        if total is not None:
            if n * cores_per_worker + client_cores > total:
                raise SystemExit(f"{n} workers × {cores_per_worker} cores + {client_cores} client cores > {total}")
            server = cpu_list(range(n * cores_per_worker))
            client = cpu_list(range(total - client_cores, total))
        for g in dict.fromkeys(n if g == "same" else int(g) for g in gateways):
            out.append(Config(n, g, server, client, per_worker * n))
    return out


def names(root: int) -> dict[int, str]:
    """Every process of Shoal's tree by a unique role name: gateway#1, worker#2, nats-server, ..."""
    seen: dict[str, int] = {}
    out: dict[int, str] = {}
    for pid in sorted(tree(root)):
        kind = label(pid)
        kind = "pychild" if kind == "worker (python model child)" else kind
        if not kind:
            continue
        seen[kind] = seen.get(kind, 0) + 1
        out[pid] = f"{kind}#{seen[kind]}"
    return out


def role(name: str) -> str:
    return name.rsplit("#", 1)[0]


def pa_command(pa: str, url: str, model: str, conc: int, span_ms: int, cpus: str, served_as: str = "") -> list[str]:
    """One perf_analyzer window longer than warm-up + span (its own report is not used: the server's
    request count over the span is the throughput)."""
    pin = ["taskset", "-c", cpus] if cpus else []
    return [
        *pin,
        *shlex.split(pa),
        "-m",
        served_as or model,
        "-u",
        url,
        "-i",
        "http",
        "--concurrency-range",
        f"{conc}:{conc}",
        "-p",
        str(span_ms),
        "-s",
        "100",
        "-r",
        "1",
        *MODELS[model],
    ]


def measure(
    pa: str, url: str, model: str, cfg: Config, shoal_pid: int, seconds: float, warm: float, served_as: str = ""
) -> dict:
    """Throughput and per-process CPU over one span in the middle of a perf_analyzer run (of Shoal's
    process tree, or Triton's: `served_as` is the model's name there)."""
    span_ms = int((warm + seconds + 1) * 1000)
    cmd = pa_command(pa, url, model, cfg.concurrency, span_ms, cfg.client_cpus, served_as)
    load = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(warm)
    procs = names(shoal_pid)
    client = tree(load.pid)
    n0, t0 = served(url, served_as or model), time.monotonic()
    c0 = {p: cpu_s(p) for p in [*procs, *client]}
    time.sleep(seconds)
    n1, t1 = served(url, served_as or model), time.monotonic()
    c1 = {p: cpu_s(p) for p in [*procs, *client]}
    try:
        text, _ = load.communicate(timeout=span_ms / 1000 + 60)
    except subprocess.TimeoutExpired:
        load.kill()
        text, _ = load.communicate()
    span, requests = t1 - t0, n1 - n0
    if requests <= 0:
        return {"error": text[-400:]}
    util = {name: (c1[p] - c0[p]) / span for p, name in procs.items()}
    per_role: dict[str, float] = {}
    for name, u in util.items():
        per_role[role(name)] = per_role.get(role(name), 0.0) + u * span / requests * 1e6
    server_cores = len(range_of(cfg.server_cpus)) if cfg.server_cpus else os.cpu_count() or 1
    busiest = sorted(util.items(), key=lambda kv: -kv[1])
    result = {
        "throughput": round(requests / span, 1),
        "requests": requests,
        "mean_latency_ms": round(cfg.concurrency / (requests / span) * 1000, 2),  # Little's law, closed loop
        "span_s": round(span, 2),
        "server_cores_busy_pct": round(sum(util.values()) / server_cores * 100, 1),
        "client_core_pct": round(sum(c1[p] - c0[p] for p in client) / span * 100, 1),
        "busiest": [[name, round(u * 100, 1)] for name, u in busiest[:4]],
        "core_pct": {name: round(u * 100, 1) for name, u in busiest},
        "cpu_us_per_request": {k: round(v, 1) for k, v in sorted(per_role.items(), key=lambda kv: -kv[1])},
    }
    return result


def range_of(cpus: str) -> range:
    lo, _, hi = cpus.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def models_repo(work: Path, python: str) -> Path:
    """One repository with identity_fp32 and the native mlp_onnx, one instance each, one ORT thread."""
    gen = work / "models"
    subprocess.run(
        [python, str(HERE / "triton_models.py"), str(gen), "--ort-threads", "1", "--instances", "1"],
        check=True,
        stdout=sys.stderr,
    )
    repo = work / "repo"
    for d in (gen / "repo" / "identity_fp32", gen / "native_repo" / "mlp_onnx"):
        shutil.copytree(d, repo / d.name, copy_function=_link_or_copy)
    return repo


def run_config(args: argparse.Namespace, cfg: Config, repo: Path, out: Path) -> dict:
    pin = ["taskset", "-c", cfg.server_cpus] if cfg.server_cpus else []
    logfile = (args.log_dir or out) / f"shoal-w{cfg.workers}-g{cfg.gateways}.log"
    shoal = Shoal([*pin, *shlex.split(args.shoal_cmd)], repo, logfile, None)
    shoal.cmd += ["--workers", str(cfg.workers), "--gateways", str(cfg.gateways)]
    result: dict = {"config": cfg.__dict__, "models": {}}
    try:
        t0 = time.monotonic()
        shoal.start(args.models)
        result["ready_s"] = round(time.monotonic() - t0, 1)
        url = f"127.0.0.1:{shoal.http}"
        assert shoal.proc is not None
        for model in args.models:
            r = measure(args.pa, url, model, cfg, shoal.proc.pid, args.seconds, args.warm)
            result["models"][model] = r
            log(f"N={cfg.workers} G={cfg.gateways} {model}: {r.get('throughput')} /s busiest {r.get('busiest')}")
    finally:
        left = shoal.stop()
        if left:
            log("WARNING: left behind:", left)
    if logfile.stat().st_size < 200_000 and not args.keep_logs:
        logfile.unlink()
    return result


def triton_repo(work: Path, python: str, instances: int) -> Path:
    """Triton's repository for N: the python models with N instances each, one ORT thread."""
    gen = work / f"triton-models-{instances}"
    if not (gen / "repo").exists():
        argv = [python, str(HERE / "triton_models.py"), str(gen), "--ort-threads", "1", "--instances", str(instances)]
        subprocess.run(argv, check=True, stdout=sys.stderr)
    return gen / "repo"


def run_triton(args: argparse.Namespace, cfg: Config, work: Path) -> dict:
    """Triton on the cores Shoal had for this N, N instances of each model, the same load."""
    repo = triton_repo(work, args.python, cfg.workers)
    rt = work / f"triton-rt-{cfg.workers}"
    triton = Triton(Path(args.anchor_venv), repo, rt)
    result: dict = {"config": cfg.__dict__, "server": "triton", "models": {}}
    t0 = time.monotonic()
    triton.start()
    try:
        if cfg.server_cpus:  # every thread of the server and of the python stubs it started
            for pid in tree(triton.pid):
                subprocess.run(
                    ["taskset", "-a", "-p", "-c", cfg.server_cpus, str(pid)], check=True, capture_output=True
                )
        result["ready_s"] = round(time.monotonic() - t0, 1)
        url = f"127.0.0.1:{triton.http}"
        for model in args.models:
            r = measure(args.pa, url, model, cfg, triton.pid, args.seconds, args.warm, TRITON_MODEL[model])
            result["models"][model] = r
            log(f"Triton N={cfg.workers} {model}: {r.get('throughput')} /s busiest {r.get('busiest')}")
    finally:
        triton.stop()
    return result


def table(runs: list[dict], models: list[str]) -> str:
    lines = [
        "| model | server | workers N | gateways G | server cores | concurrency | throughput /s | ×(N=1) | ÷ Triton | "
        "mean latency ms | server cores busy | busiest processes (% of one core) | client cores busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in models:
        shoal_runs = [r for r in runs if r.get("server", "shoal") == "shoal"]
        base = next((r["models"][model].get("throughput") for r in shoal_runs if model in r["models"]), None)
        triton = {
            r["config"]["workers"]: r["models"][model].get("throughput")
            for r in runs
            if r.get("server") == "triton" and model in r["models"]
        }
        for r in runs:
            m, c, server = r["models"].get(model, {}), r["config"], r.get("server", "shoal")
            if "throughput" not in m:
                lines.append(
                    f"| {model} | {server} | {c['workers']} | {c['gateways']} | | | error | | | | | "
                    f"{m.get('error', '')[:80]} | |"
                )
                continue
            cores = len(range_of(c["server_cpus"])) if c["server_cpus"] else "all"
            busy = ", ".join(f"{n} {u:.0f}" for n, u in m["busiest"][:3])
            x = f"{m['throughput'] / base:.2f}" if base and server == "shoal" else ""
            versus = triton.get(c["workers"]) if server == "shoal" else None
            ratio = f"{m['throughput'] / versus:.2f}" if versus else ""
            gateways = c["gateways"] if server == "shoal" else "–"
            lines.append(
                f"| {model} | {server} | {c['workers']} | {gateways} | {cores} | {c['concurrency']} | "
                f"{m['throughput']:,.0f} | {x} | {ratio} | {m['mean_latency_ms']:.1f} | {m['server_cores_busy_pct']:.0f}% | "
                f"{busy} | {m['client_core_pct'] / 100:.1f} |"
            )
    return "\n".join(lines)


def cpu_table(runs: list[dict], models: list[str]) -> str:
    """CPU µs per request by role (all processes of a role together) and the single busiest process."""
    roles = ["gateway", "scheduler", "nats-server", "worker", "pychild"]
    lines = [
        "| model | N | G | " + " | ".join(roles) + " | total µs/request | scheduler % of one core |",
        "|---|---|---|" + "---|" * (len(roles) + 2),
    ]
    for model in models:
        for r in runs:
            m, c = r["models"].get(model, {}), r["config"]
            if "throughput" not in m or r.get("server") == "triton":
                continue
            cpu = m["cpu_us_per_request"]
            lines.append(
                f"| {model} | {c['workers']} | {c['gateways']} | "
                + " | ".join(f"{cpu.get(k, 0):.0f}" for k in roles)
                + f" | {sum(cpu.values()):.0f} | {m['core_pct'].get('scheduler#1', 0):.0f} |"
            )
    return "\n".join(lines)


def render(report: dict) -> str:
    models = report["settings"]["models"]
    return f"{header(report)}\n\n{table(report['runs'], models)}\n\n{cpu_table(report['runs'], models)}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2,4,6", help="comma list of worker counts N (default 1,2,4,6)")
    ap.add_argument("--gateways", default="same,1", help="comma list: 'same' (G = N) and/or numbers (default same,1)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured span per model (default 8)")
    ap.add_argument("--warm", type=float, default=3.0, help="load before the span starts (default 3)")
    ap.add_argument("--per-worker-concurrency", type=int, default=16, help="concurrency = this × N (default 16)")
    ap.add_argument("--cores-per-worker", type=int, default=2, help="Shoal is pinned to N × this (default 2)")
    ap.add_argument("--client-cores", type=int, default=4, help="perf_analyzer's cores, the host's last (default 4)")
    ap.add_argument("--no-pin", action="store_true", help="no taskset: everything shares every core")
    ap.add_argument("--pa", default=os.environ.get("PERF_ANALYZER", "perf_analyzer"), help="perf_analyzer command")
    ap.add_argument("--shoal-cmd", default=os.environ.get("SHOAL_CMD", "shoal"), help="how to run Shoal's CLI")
    ap.add_argument("--python", default=sys.executable, help="python that writes the models (needs onnx)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "scale")
    ap.add_argument("--log-dir", type=Path, default=None, help="where shoal serve logs go (default: --out)")
    ap.add_argument("--keep-logs", action="store_true", help="keep every shoal serve log (default: only large ones)")
    ap.add_argument("--render", type=Path, default=None, help="only print the markdown of a saved scale.json")
    ap.add_argument("--triton", action="store_true", help="also Triton 2.51 on the same cores, N instances per model")
    ap.add_argument("--anchor-venv", default=os.environ.get("ANCHOR_VENV", "/tmp/anchor-venv"))
    ap.add_argument(
        "--setup-script",
        default=os.environ.get("SHOAL_BENCH_SETUP", str(HERE.parent.parent / "shared/bench/setup_triton.sh")),
    )
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    args.models = [m for m in args.models.split(",") if m]
    if unknown := [m for m in args.models if m not in MODELS]:
        ap.error(f"unknown model(s) {unknown}; known: {list(MODELS)}")
    workers = [int(n) for n in args.workers.split(",")]
    configs = plan(
        workers,
        args.gateways.split(","),
        args.per_worker_concurrency,
        args.cores_per_worker,
        args.client_cores,
        None if args.no_pin else os.cpu_count() or 1,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "runs": [],
    }
    if args.triton and not (Path(args.anchor_venv) / "bin" / "pa").exists():
        log("anchor env missing: running", args.setup_script)
        env = dict(os.environ, ANCHOR_VENV=args.anchor_venv)
        subprocess.run(["bash", args.setup_script], env=env, check=True, stdout=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="scale-") as work:
        repo = models_repo(Path(work), args.python)
        runs: list[tuple[str, Config]] = [("shoal", cfg) for cfg in configs]
        if args.triton:  # one Triton run per N, on the cores of that N's first Shoal configuration
            firsts = {cfg.workers: cfg for cfg in reversed(configs)}
            runs += [("triton", firsts[n]) for n in sorted(firsts)]
        for server, cfg in runs:
            try:
                if server == "triton":
                    report["runs"].append(run_triton(args, cfg, Path(work)))
                else:
                    report["runs"].append(run_config(args, cfg, repo, args.out))
            except Exception as e:  # one broken configuration must not cost the others' numbers
                log(f"{server} N={cfg.workers} G={cfg.gateways} failed: {e!r}")
                report["runs"].append({"config": cfg.__dict__, "server": server, "models": {}, "error": repr(e)})
            (args.out / "scale.json").write_text(json.dumps(report, indent=1, default=str))
    md = render(report)
    (args.out / "scale.md").write_text(md)
    print(md)
    return 0


def cpu_model() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def header(report: dict) -> str:
    s, h = report["settings"], report["host"]
    return (
        f"Shoal scale run {report['started']} on {h['cpus']} CPUs ({h['cpu']}): Shoal pinned to N × "
        f"{s['cores_per_worker']} cores, perf_analyzer on {s['client_cores']} other cores"
        f"{' (no pinning)' if s['no_pin'] else ''}, concurrency {s['per_worker_concurrency']} × N, "
        f"{s['seconds']} s measured after {s['warm']} s of load."
    )


if __name__ == "__main__":
    sys.exit(main())

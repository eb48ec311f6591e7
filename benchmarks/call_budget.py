#!/usr/bin/env python3
"""The call budget per request (issue 35): Python function calls per request at batch 1, per process,
counted by cProfile (a count the machine's load does not move), and with `--callgrind` the
instructions per request of the same processes (valgrind).

usage: python benchmarks/call_budget.py [--requests 500] [--cases python,native] [--callgrind N]
                                        [--tree TREE] [--out DIR]

Cases (binary HTTP requests as perf_analyzer sends them, one at a time, so every batch is one request):
  python: `identity_fp32` as a python-backend model with dynamic batching (benchmarks/triton_models.py):
          the gateway with its co-hosted scheduler, and the python model's own process (its loop thread);
  native: the example repository's `identity_fp32` (onnxruntime, dynamic batching): the gateway, and
          the worker's loop thread.
Each case is served twice by `shoal serve` with SHOAL_PROFILE_DIR set (shared/process/runtime.py: cProfile
of each service's main thread), after the same warm-up, with N and 2N requests; the difference of each
process's total over N is its calls per request (start-up and shutdown cancel out). The budgets the issue
sets are printed beside the counts: gateway with its scheduler 150, the python model's loop thread 100
per batch, the worker 100 per batch.

`--tree TREE` runs `shoal serve` from TREE (`PYTHONPATH=TREE`, e.g. an unpacked compiled wheel) instead of
the installed package. cProfile sees the calls the interpreter makes: a call inside a compiled module
(shoal/compiled_modules.py) to another compiled function is a C call it does not count, so a compiled build counts
fewer calls for the same work; compare instructions for the cost.
`--callgrind N` also runs benchmarks/callgrind_gateway.py (`--sole`, N requests at c=1) and
benchmarks/python_child.py (`--callgrind N`, c=1) on the same models from the same tree.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from callgrind_gateway import load, request_body  # noqa: E402
from vs_triton import Shoal, label, tree  # noqa: E402

BUDGET = {"gateway": 150, "worker (python model child)": 100, "worker": 100}
HERE = Path(__file__).resolve().parent


Counts = dict[str, dict[str, int]]  # role -> function -> calls


def serve_and_count(repo: Path, model: str, requests: int, log: Path, source: Path | None) -> Counts:
    """Python calls per function per process (by role) over a `shoal serve` run that served `requests`
    + warm-up. The profiles stay beside `log`, one folder per run (pstats: callers and callees)."""
    with tempfile.TemporaryDirectory() as folder:
        env = {"SHOAL_PROFILE_DIR": folder}
        if source is not None:
            env["PYTHONPATH"] = str(source)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        roles: dict[int, str] = {}
        try:
            cmd = [sys.executable, "-m", "shoal.cli"]
            shoal = Shoal(cmd, repo, log, None)
            shoal.start([model])
            try:
                port = int(shoal.http)
                body = request_body(port, model)
                load(port, model, body, 100, 1)  # warm-up
                roles = {pid: label(pid) or "?" for pid in tree(shoal.proc.pid)}  # type: ignore[union-attr]
                load(port, model, body, requests, 1)
            finally:
                shoal.stop()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        calls: Counts = {}
        kept = log.with_suffix(".prof")
        kept.mkdir(exist_ok=True)
        for path in glob.glob(f"{folder}/*.prof"):
            role = re.sub(r"\W+", "_", roles.get(int(Path(path).stem.rsplit("-", 1)[1]), "other"))
            shutil.copy(path, kept / f"{role}-{Path(path).name}")
            pid = int(Path(path).stem.rsplit("-", 1)[1])
            role = roles.get(pid, Path(path).stem.rsplit("-", 1)[0])
            per = calls.setdefault(role, {})
            for (file, line, name), row in pstats.Stats(path).stats.items():  # type: ignore[attr-defined]
                key = f"{name} ({'/'.join(Path(file).parts[-2:])}:{line})"
                per[key] = per.get(key, 0) + row[1]  # all calls, recursive ones included, as total_calls
        return calls


def top(one: dict[str, int], two: dict[str, int], n: int, count: int = 12) -> list[tuple[str, float]]:
    """The functions called most per request (the difference of the two runs over n)."""
    per = {k: (two.get(k, 0) - one.get(k, 0)) / n for k in set(one) | set(two)}
    return sorted(((k, v) for k, v in per.items() if v >= 0.5), key=lambda kv: -kv[1])[:count]


def by_file(one: dict[str, int], two: dict[str, int], n: int, count: int = 16) -> list[tuple[str, float]]:
    """Calls per request by the file of the function called (builtins as one row): which modules the
    calls go to, so which ones compiling or a shorter path would cut."""
    per: dict[str, float] = {}
    for k in set(one) | set(two):
        where = k.rsplit("(", 1)[1].rsplit(":", 1)[0]
        where = "builtins (C functions the interpreted code calls)" if where == "~" else where
        per[where] = per.get(where, 0.0) + (two.get(k, 0) - one.get(k, 0)) / n
    return sorted(((k, v) for k, v in per.items() if v >= 0.5), key=lambda kv: -kv[1])[:count]


def repositories(work: Path) -> dict[str, tuple[Path, str]]:
    from services.repository.examples import write_examples

    python_models = work / "python"
    subprocess.run([sys.executable, str(HERE / "triton_models.py"), str(python_models)], check=True)
    return {
        "python": (python_models / "repo", "identity_fp32"),
        "native": (write_examples(work / "native"), "identity_fp32"),
    }


def callgrind(repo: Path, model: str, requests: int, source: Path, python_child: bool) -> None:
    gateway = [sys.executable, str(HERE / "callgrind_gateway.py"), str(repo), model, str(source)]
    subprocess.run([*gateway, "--sole", "--requests", str(requests), "--concurrency", "1"], check=True)
    if python_child:
        child = [sys.executable, str(HERE / "python_child.py"), str(repo), "--model", model, "--callgrind"]
        env = {**os.environ, "PYTHONPATH": str(source)}
        subprocess.run([*child, str(requests), "--concurrency", "1", "--rounds", "1"], check=True, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--cases", default="python,native")
    ap.add_argument("--tree", type=Path, default=None, help="run shoal serve from this tree (PYTHONPATH)")
    ap.add_argument("--callgrind", type=int, default=0, metavar="N", help="also count instructions over N requests")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--top", type=int, default=12, help="how many of the functions called most to list")
    args = ap.parse_args()
    out = (args.out or Path(tempfile.mkdtemp(prefix="call-budget-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    source = args.tree.resolve() if args.tree else None
    if source is not None:
        os.chdir(source)  # `python -m` puts the working directory first: the checkout's sources would win
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as models:
        repos = repositories(Path(models))
        for case in args.cases.split(","):
            repo, model = repos[case]
            n = args.requests
            one = serve_and_count(repo, model, n, out / f"{case}-1.log", source)
            two = serve_and_count(repo, model, 2 * n, out / f"{case}-2.log", source)
            totals = {k: round((sum(two.get(k, {}).values()) - sum(one.get(k, {}).values())) / n, 1) for k in two}
            results[case] = {k: v for k, v in sorted(totals.items()) if v >= 1}
            print(case, json.dumps(results[case]), flush=True)
            for role in results[case]:
                print(f"  {case} / {role}, most calls per request:")
                for function, calls in top(one.get(role, {}), two.get(role, {}), n, args.top):
                    print(f"    {calls:6.1f}  {function}")
                print(f"  {case} / {role}, calls per request by file:")
                for where, calls in by_file(one.get(role, {}), two.get(role, {}), n):
                    print(f"    {calls:6.1f}  {where}")
            if args.callgrind:
                callgrind(repo, model, args.callgrind, source or HERE.parent, case == "python")
    (out / "call_budget.json").write_text(json.dumps(results, indent=2))
    print(f"\n| case | process | Python calls per request (batch 1) | budget |\n|---|---|---|---|  tree: {source}")
    for case, per in results.items():
        for role, calls in per.items():
            print(f"| {case} | {role} | {calls:g} | {BUDGET.get(role, '-')} |")


if __name__ == "__main__":
    main()

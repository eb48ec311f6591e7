"""MLServer, the Python peer in benchmarks/vs_triton.py: its server, and a load that all three take.

MLServer runs from its own venv (benchmarks/setup_mlserver.sh: it pins many packages) on the
models of benchmarks/mlserver_models.py. perf_analyzer cannot drive it: perf_analyzer (and
`shoal perf`) send the V2 binary tensor extension, which MLServer does not read ("failed to parse
the request JSON buffer"). So the three servers are measured alike with `wrk` (C, keep-alive, one
connection per concurrent request, as perf_analyzer's concurrency) posting the same JSON request,
and each server's CPU per request is counted from /proc over the same span.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (model on every server, elements of INPUT0 at batch 1)
JSON_CASES = {"identity_json_c16": ("identity_fp32", 16), "mlp_py_json_c16": ("mlp_onnx_py", 256)}
CONCURRENCY = 16


def _log(*a: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


class MLServer:
    """`mlserver start` on free ports, in its own session so that its worker processes stop with it."""

    def __init__(self, venv: Path, models: Path, ports: tuple[int, int, int], logfile: Path) -> None:
        self.venv, self.models, self.logfile = venv, models, logfile
        self.http, self.grpc, self.metrics = ports
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, names: list[str], timeout: float = 300) -> None:
        env = dict(
            os.environ,
            MLSERVER_HOST="127.0.0.1",
            MLSERVER_HTTP_PORT=str(self.http),
            MLSERVER_GRPC_PORT=str(self.grpc),
            MLSERVER_METRICS_PORT=str(self.metrics),
        )
        env.pop("PYTHONPATH", None)  # its venv only: Shoal's tree must not shadow its packages
        self.proc = subprocess.Popen(
            [str(self.venv / "bin" / "mlserver"), "start", str(self.models)],
            env=env,
            stdout=open(self.logfile, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlserver exited ({self.proc.returncode}); log: {self.logfile}")
            if all(_ready(self.http, name) for name in names):
                _log(f"mlserver ready: pid {self.proc.pid} http=127.0.0.1:{self.http}")
                return
            time.sleep(0.5)
        raise RuntimeError(f"mlserver not ready after {timeout:.0f} s; log: {self.logfile}")

    def stop(self) -> None:
        """SIGTERM to its session (the server and its inference workers), SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                _log(f"mlserver still running after {sig.name}")


def _ready(port: int, model: str) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/ready", timeout=2).status == 200
    except OSError:
        return False


def wrk_script(directory: Path, elements: int) -> Path:
    """A wrk Lua script posting one batch-1 FP32 request of `elements` values as plain V2 JSON."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, elements], "datatype": "FP32", "data": [0.5] * elements}]}
    )
    path = directory / f"post-{elements}.lua"
    path.write_text(
        f'wrk.method = "POST"\nwrk.body = [[{body}]]\nwrk.headers["Content-Type"] = "application/json"\n'
        "function response(status, headers, body)\n"
        '  if status ~= 200 then io.stderr:write("HTTP " .. status .. " " .. body .. "\\n") end\nend\n'
    )
    return path


def wrk(port: int, model: str, script: Path, seconds: int) -> dict:
    """Requests/s, p50 µs and the count from one wrk run at CONCURRENCY connections."""
    url = f"http://127.0.0.1:{port}/v2/models/{model}/infer"
    cmd = ["wrk", "-t1", f"-c{CONCURRENCY}", f"-d{seconds}s", "--latency", "-s", str(script), url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    return parse_wrk(r.stdout, r.stderr)


def parse_wrk(stdout: str, stderr: str) -> dict:
    """wrk's report as numbers; an error when any answer was not 200 (the script logs those)."""
    rate = re.search(r"Requests/sec:\s+([\d.]+)", stdout)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)\b", stdout)
    count = re.search(r"(\d+) requests in", stdout)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", stdout)
    if rate is None or p50 is None or count is None or errors is not None or "HTTP " in stderr:
        return {"error": (stderr or stdout).strip()[-300:]}
    scale = {"us": 1, "ms": 1e3, "s": 1e6}[p50.group(2)]
    return {"throughput": float(rate.group(1)), "p50_us": float(p50.group(1)) * scale, "requests": int(count.group(1))}


def measure(servers: dict[str, tuple[int, int]], quick: bool, cpu_of) -> dict:
    """Each JSON case on every server in turn, twice (A, B, C, A, B, C): throughput, p50 and the
    server's CPU µs per request. `servers`: name -> (HTTP port, root pid); `cpu_of(pid)`: CPU
    seconds of the process tree under pid."""
    seconds = 5 if quick else 10
    results: dict = {}
    with tempfile.TemporaryDirectory() as d:
        for case, (model, elements) in JSON_CASES.items():
            script = wrk_script(Path(d), elements)
            for port, _ in servers.values():  # warm-up
                subprocess.run(
                    [
                        "wrk",
                        "-t1",
                        "-c4",
                        "-d2s",
                        "-s",
                        str(script),
                        f"http://127.0.0.1:{port}/v2/models/{model}/infer",
                    ],
                    capture_output=True,
                    timeout=60,
                )
            runs: dict[str, list[dict]] = {name: [] for name in servers}
            for _ in range(2):
                for name, (port, pid) in servers.items():
                    before = cpu_of(pid)
                    r = wrk(port, model, script, seconds)
                    if "requests" in r:
                        r["server_cpu_us_per_request"] = round((cpu_of(pid) - before) / r["requests"] * 1e6, 1)
                    runs[name].append(r)
                    _log(f"json {case} {name}: {r}")
            results[case] = runs
    return results


def render(results: dict) -> list[str]:
    """Markdown lines: per case and server, the two runs and the medians; Shoal's ratio to each."""
    if not results:
        return []
    lines = [
        "",
        f"Plain V2 JSON requests, wrk at c={CONCURRENCY} (MLServer reads no binary tensors; the three servers alike):",
        "",
        "| case | server | infer/s run 1, 2 | p50 µs | server CPU µs/req | Shoal/this (infer/s) |",
        "|---|---|---|---|---|---|",
    ]
    for case, runs in results.items():
        shoal = _median(runs.get("shoal", []), "throughput")
        for name, rs in runs.items():
            rate = _median(rs, "throughput")
            ratio = f"{shoal / rate:.2f}×" if shoal and rate and name != "shoal" else ""
            cells = ", ".join(f"{r['throughput']:,.0f}" if "throughput" in r else "error" for r in rs)
            p50, cpu = _median(rs, "p50_us"), _median(rs, "server_cpu_us_per_request")
            lines.append(
                f"| {case} | {name} | {cells} | {p50 or 0:,.0f} | {cpu or 0:,.0f} | {ratio} |"
                if p50
                else f"| {case} | {name} | {cells} | n/a | n/a | |"
            )
    return lines


def _median(runs: list[dict], key: str) -> float | None:
    values = sorted(r[key] for r in runs if key in r)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

"""Chaos soak: mixed load on `shoal serve` while it kills and breaks things (docs/reliability.md).

    python benchmarks/soak.py --minutes 10        # the figures in docs/reliability.md
    python benchmarks/soak.py --seconds 60        # the CI version (tests/integration/test_soak.py)

Client threads send requests to several models (simple, mlp, a python model; HTTP, and gRPC
when `shoal serve` has a gRPC port) while, in turn, a worker, the scheduler, the nats-server and
the python model's process are SIGKILLed, a model is reloaded, and malformed and oversized
bodies are sent. At the end it prints requests sent, succeeded, failed with a clear error, hung
(ended later than their deadline plus a grace: must be 0), the recovery time after each fault,
/dev/shm entries left behind, and the RSS of each service at start and end.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.repository import examples  # noqa: E402
from shared.process.natsserver import free_port  # noqa: E402
from shoal.unimplemented_flags import REFUSED  # noqa: E402
from tests.integration.ensemble_models import write_python  # noqa: E402
from tests.serving import Serve, command_of  # noqa: E402

GRACE_S = 3.0  # past its deadline, a request still running counts as hung
RECOVERY_S = 12.0  # no fault in the run's last seconds: a recovery needs load after it to be seen
# model -> its inputs: (name, shape, datatype)
MODELS = {
    "simple": [("INPUT0", [1, 16], "INT32"), ("INPUT1", [1, 16], "INT32")],
    "mlp": [("INPUT0", [1, 256], "FP32")],
    "py_double": [("X", [1, 4], "FP32")],
}
ROLES = ("gateway", "scheduler", "worker", "repository", "nats-server", "py_double")


@dataclass
class Outcome:
    started: float
    ended: float
    model: str
    protocol: str
    ok: bool
    error: str = ""


@dataclass
class Soak:
    serve: Serve
    timeout_s: float
    grpc_port: int = 0
    results: list[Outcome] = field(default_factory=list)
    faults: list[tuple[str, float]] = field(default_factory=list)
    bad_bodies: dict[str, int] = field(default_factory=dict)
    fault_errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def client(self, protocol: str):
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            return grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
        import tritonclient.http as httpclient

        return httpclient, httpclient.InferenceServerClient(
            self.serve.url, network_timeout=self.timeout_s + 30, connection_timeout=self.timeout_s + 30
        )

    def load(self, index: int) -> None:
        protocol = "grpc" if self.grpc_port and index % 2 else "http"
        module, client = self.client(protocol)
        names = list(MODELS)
        count = index
        while not self.stop.is_set():
            model = names[count % len(names)]
            count += 1
            tensors = []
            for name, shape, datatype in MODELS[model]:
                tensors.append(module.InferInput(name, shape, datatype))
                tensors[-1].set_data_from_numpy(np.ones(shape, np.int32 if datatype == "INT32" else np.float32))
            started = time.monotonic()
            try:
                if protocol == "grpc":
                    client.infer(model, tensors, client_timeout=self.timeout_s + 30)
                else:
                    client.infer(model, tensors)
                self.results.append(Outcome(started, time.monotonic(), model, protocol, True))
            except Exception as exc:  # InferenceServerException, or the connection itself
                self.results.append(Outcome(started, time.monotonic(), model, protocol, False, describe(exc)))
                time.sleep(0.05)  # a failing client does not spin
        client.close()

    # -- faults ------------------------------------------------------------------
    def kill(self, *needles: str) -> None:
        """SIGKILL the first process matching the first needle that matches any."""
        for needle in needles:
            pids = [p for p in self.serve.tree() if needle in command_of(p)]
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                return

    def reload(self) -> None:
        request = urllib.request.Request(f"http://{self.serve.url}/v2/repository/models/mlp/load", data=b"{}")
        with urllib.request.urlopen(request, timeout=120):
            pass

    def bad_requests(self) -> None:
        """Malformed JSON (Triton answers 500 with the parser's text), data of the wrong size
        (500, as Triton) and a body over --http-max-input-size (400): each answered at once
        with Triton's status and an error text."""
        url = f"http://{self.serve.url}/v2/models/simple/infer"
        wrong = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1]}]}
        for kind, body, headers in (
            ("malformed", b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype"', {}),
            ("wrong size", json.dumps(wrong).encode(), {}),
            ("oversized", b"\0" * (64 * 1024 * 1024 + 1), {"Content-Type": "application/octet-stream"}),
        ):
            request = urllib.request.Request(url, data=body, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, text = response.status, ""
            except urllib.error.HTTPError as exc:
                status, text = exc.code, exc.read().decode(errors="replace")
            except OSError as exc:  # the server may close an oversized upload early: also a refusal
                status, text = 0, str(exc)
            explained = '"error"' in text
            key = f"{kind}: {status}" + ("" if explained else " (no error text)")
            self.bad_bodies[key] = self.bad_bodies.get(key, 0) + 1

    def fault(self, name: str) -> None:
        self.faults.append((name, time.monotonic()))
        try:
            self._inject(name)
        except (OSError, urllib.error.URLError) as exc:  # e.g. a reload refused while recovering
            self.fault_errors.append(f"{name}: {exc}")

    def _inject(self, name: str) -> None:
        {
            "kill worker": lambda: self.kill("shoal.cli worker"),
            # co-hosted (shoal serve's default): the scheduler dies with its gateway (docs/design.md §7)
            "kill scheduler": lambda: self.kill("shoal.cli scheduler", "shoal.cli gateway"),
            "kill nats-server": lambda: self.kill("nats-server"),
            "kill python model process": lambda: self.kill("--models py_double"),
            "reload mlp": self.reload,
            "bad bodies": self.bad_requests,
        }[name]()

    # -- figures -------------------------------------------------------------------
    def recovery(self, at: float, until: float) -> float | None:
        """Seconds from a fault until every model answered a request sent after it."""
        firsts = []
        for model in MODELS:
            ends = [r.ended for r in self.results if r.ok and r.model == model and r.started >= at and r.ended < until]
            if not ends:
                return None
            firsts.append(min(ends))
        return max(firsts) - at


def describe(exc: Exception) -> str:
    """'<status> <message>' of a tritonclient error ('<type> <text>' for anything else)."""
    status = exc.status() if hasattr(exc, "status") else ""
    message = exc.message() if hasattr(exc, "message") else str(exc)
    return f"{status or type(exc).__name__} {message or ''}"


def rss_by_role(serve: Serve) -> dict[str, int]:
    """Resident memory (KiB) of each service, summed over the processes of a role."""
    rss: dict[str, int] = {}
    for pid in serve.tree():
        command = command_of(pid)
        if "--models py_double" in command:
            role = "py_double"
        elif "nats-server" in command.split(" ", 1)[0]:
            role = "nats-server"
        else:
            role = next((r for r in ROLES if f"shoal.cli {r} " in command), None)
        if role is None:
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
        rss[role] = rss.get(role, 0) + kib
    return rss


def write_repository(root: Path) -> Path:
    examples.write_examples(root)
    write_python(root, "py_double", "double")
    return root


def run(
    seconds: float, clients: int = 6, timeout_s: float = 10.0, workers: int = 2, workdir: Path | None = None
) -> dict:
    """`workdir`: where the repository and the serve's logs go (a new temporary directory, kept for
    reading the logs, when none is given)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="shoal-soak-"))
    models = write_repository(workdir / "models")
    args = [
        f"--model-repository={models}",
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--workers={workers}",
        f"--request-timeout-secs={timeout_s}",
    ]
    grpc_port = 0
    if "--grpc-port" not in REFUSED:
        grpc_port = free_port()
        args.append(f"--grpc-port={grpc_port}")
    started_wall = time.time()
    serve = Serve(workdir / "run", args)
    try:
        return _soak(serve.start(), seconds, clients, timeout_s, grpc_port, started_wall)
    finally:
        _stop(serve)


def _stop(serve: Serve) -> None:
    """A clean stop, so that its scratch directories go with it (shared/process/scratch.py)."""
    if serve.process is None or serve.process.poll() is not None:
        return
    try:
        serve.terminate(60)
    except AssertionError:  # SIGKILLed then: its children die with it (shared/process/lifeline.py)
        pass


def _soak(serve: Serve, seconds: float, clients: int, timeout_s: float, grpc_port: int, started_wall: float) -> dict:
    soak = Soak(serve, timeout_s, grpc_port)
    rss_start = rss_by_role(serve)
    threads = [threading.Thread(target=soak.load, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    order = [
        "kill worker",
        "kill scheduler",
        "kill nats-server",
        "kill python model process",
        "reload mlp",
        "bad bodies",
    ]
    interval = max(8.0, (seconds - 5 - RECOVERY_S) / len(order)) if seconds < 120 else 15.0
    next_fault, index = began + 5, 0
    last_fault = began + seconds - RECOVERY_S  # the load goes on long enough to see the last fault recover
    while time.monotonic() - began < seconds:
        if next_fault <= time.monotonic() <= last_fault:
            soak.fault(order[index % len(order)])
            index += 1
            next_fault += interval
        time.sleep(0.1)
    rss_end = rss_by_role(serve)
    soak.stop.set()
    for thread in threads:
        thread.join(timeout_s + 60)
    stop_s = serve.terminate(60)
    shm_left = [p for p in glob.glob("/dev/shm/shoal_*") if os.path.getmtime(p) >= started_wall]
    ends = [t for _, t in soak.faults[1:]] + [time.monotonic()]
    failed = [r for r in soak.results if not r.ok]
    return {
        "seconds": round(time.monotonic() - began, 1),
        "clients": clients,
        "protocols": sorted({r.protocol for r in soak.results}),
        "sent": len(soak.results),
        "succeeded": sum(r.ok for r in soak.results),
        "failed_clear": sum(
            bool(r.error.split(" ", 1)[-1].strip()) and r.ended - r.started <= timeout_s + GRACE_S for r in failed
        ),
        "hung": sum(r.ended - r.started > timeout_s + GRACE_S for r in soak.results),
        "errors": _count(r.error[:90] for r in failed),
        "recovery_s": [
            (name, None if (s := soak.recovery(at, end + 30)) is None else round(s, 2))
            for (name, at), end in zip(soak.faults, ends)
        ],
        "bad_bodies": soak.bad_bodies,
        "fault_errors": soak.fault_errors,
        "shm_left": len(shm_left),
        "rss_kib_start": rss_start,
        "rss_kib_end": rss_end,
        "stop_s": round(stop_s, 1),
        "log": str(serve.log_path),
    }


def _count(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=0)
    parser.add_argument("--seconds", type=float, default=0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=10.0, help="request deadline (--request-timeout-secs)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    args = parser.parse_args()
    seconds = args.seconds or args.minutes * 60 or 60
    summary = run(seconds, args.clients, args.timeout)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()

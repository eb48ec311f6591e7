"""The front doors under 100,000 generated inputs (docs/security.md, "Front doors").

    python benchmarks/fuzz_front_doors.py                  # 100,000 cases: the figures in docs/security.md
    python benchmarks/fuzz_front_doors.py --cases 7000     # a quick look, the same mix
    python benchmarks/fuzz_front_doors.py --only http-wire # one door, its share of the 100,000

One real cluster (nats-server and the services, the gateway unsupervised so that a crash shows);
the generators of the CI slice (tests/gateway/fuzz/): KServe JSON bodies, binary-extension
bodies, odd headers, shared-memory registrations, a raw-socket HTTP/1.1 fuzzer, ModelInfer
messages and raw HTTP/2 sessions. Every case must be answered (Triton's status and error text) or
closed within the deadline; every 250 cases the gateway must answer /v2/health/ready. It prints,
per door, the cases sent, wrong answers, hangs, the readiness checks failed, and whether the
gateway crashed; then the gateway's RSS at start, its largest, at the end, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cluster import running_cluster  # noqa: E402
from tests.gateway.fuzz import grpc_inputs as g  # noqa: E402
from tests.gateway.fuzz import h2_wire as h  # noqa: E402
from tests.gateway.fuzz import http_wire as w  # noqa: E402
from tests.gateway.fuzz import kserve_inputs as k  # noqa: E402
from tests.gateway.fuzz.doors import (  # noqa: E402
    CASE_S,
    Doors,
    Hang,
    check_triton_answer,
    exchange,
    fuzz_repository,
    http_request,
    one_answer,
    raise_fd_limit,
    responses,
)

# share of the cases per door (sums to 1)
MIX = {
    "http-json": 0.30,
    "http-binary": 0.12,
    "http-headers": 0.12,
    "http-shm-register": 0.10,
    "http-wire": 0.12,
    "grpc-infer": 0.12,
    "h2-frames": 0.12,
}
READY_EVERY = 250
SHOWN = 3  # wrong answers shown per door


@dataclass
class Tally:
    cases: int = 0
    wrong: int = 0
    hangs: int = 0
    not_ready: int = 0
    crashed: bool = False
    examples: list[str] = field(default_factory=list)


class Run:
    def __init__(self, doors: Doors, infer: grpc.UnaryUnaryMultiCallable) -> None:
        self.doors = doors
        self.infer = infer
        self.tallies: dict[str, Tally] = {}
        self.rss = [doors.rss_kib()]
        self.total = 0

    def door(self, name: str, strategy: st.SearchStrategy[Any], send: Callable[[Any], None], count: int) -> None:
        tally = self.tallies.setdefault(name, Tally())

        @settings(
            max_examples=count,
            database=None,
            deadline=None,
            phases=[Phase.generate],  # every case counted, none shrunk: a failure is tallied, not raised
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def case(value: Any) -> None:
            if tally.crashed:
                return
            tally.cases += 1
            self.total += 1
            try:
                send(value)
            except Hang as hang:
                tally.hangs += 1
                self._show(tally, f"hang: {hang}"[:300])
            except Exception as wrong:  # a wrong answer, or one the checks could not read: shown
                tally.wrong += 1
                self._show(tally, f"{type(wrong).__name__}: {wrong}"[:300] + f" <- {value!r}"[:300])
            self._check(tally)

        case()

    def _check(self, tally: Tally) -> None:
        process = self.doors.running.cluster.child("gateway").process
        if process is None or process.poll() is not None:
            tally.crashed = True
            return
        if self.total % READY_EVERY == 0:
            try:
                self.doors.ready()
            except (AssertionError, OSError):
                tally.not_ready += 1
            self.rss.append(self.doors.rss_kib())
            if self.total % (READY_EVERY * 20) == 0:
                print(f"  {self.total} cases, gateway RSS {self.rss[-1] // 1024} MiB", flush=True)

    @staticmethod
    def _show(tally: Tally, text: str) -> None:
        if len(tally.examples) < SHOWN:
            tally.examples.append(text)


def senders(doors: Doors, infer: grpc.UnaryUnaryMultiCallable) -> dict[str, tuple[st.SearchStrategy[Any], Callable]]:
    port = doors.http_port

    def json_body(case: tuple[str, bytes]) -> None:
        one_answer(port, http_request("POST", f"/v2/models/{case[0]}/infer", case[1]))

    def binary(case: tuple[bytes, list[tuple[bytes, bytes]]]) -> None:
        one_answer(port, http_request("POST", "/v2/models/simple/infer", case[0], case[1]))

    def headers(case: tuple[list[tuple[bytes, bytes]], bytes]) -> None:
        one_answer(port, http_request("POST", "/v2/models/simple/infer", case[1], case[0]))

    def register(case: tuple[str, bytes]) -> None:
        path = f"/v2/systemsharedmemory/region/{quote(case[0], safe='')}/register"
        status, _ = one_answer(port, http_request("POST", path, case[1]))
        assert status != 200, "a region no client made was registered"

    def wire(raw: bytes) -> None:
        for status, body in responses(exchange(port, raw, half_close=True)):
            check_triton_answer(status, body)

    def grpc_call(message: bytes) -> None:
        try:
            infer(message, timeout=CASE_S)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Hang(f"ModelInfer: {error.details()}") from None
            if error.code() == grpc.StatusCode.UNKNOWN:
                raise

    def frames(data: bytes) -> None:
        h.session(doors.grpc_port, data, CASE_S)

    return {
        "http-json": (st.tuples(st.sampled_from(k.MODELS), k.json_bodies()), json_body),
        "http-binary": (k.binary_requests(), binary),
        "http-headers": (st.tuples(k.header_sets, k.json_bodies()), headers),
        "http-shm-register": (k.registrations(), register),
        "http-wire": (w.raw_requests(), wire),
        "grpc-infer": (g.infer_messages(), grpc_call),
        "h2-frames": (h.sessions(), frames),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--json", default="", help="also write the tallies to this file")
    parser.add_argument("--only", nargs="*", choices=sorted(MIX), help="these doors only, with their share of --cases")
    args = parser.parse_args()
    raise_fd_limit()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        root = fuzz_repository(Path(tmp) / "models")
        with running_cluster(root, supervise=False, allow_client_shm=True, http_max_input_size=1 << 20) as running:
            doors = Doors(running)
            doors.ready()
            with grpc.insecure_channel(f"127.0.0.1:{doors.grpc_port}") as channel:
                run = Run(doors, channel.unary_unary(h.INFER.decode()))
                for name, (strategy, send) in senders(doors, run.infer).items():
                    if args.only and name not in args.only:
                        continue
                    count = round(args.cases * MIX[name])
                    print(f"{name}: {count} cases", flush=True)
                    run.door(name, strategy, send, count)
                doors.ready()
                run.rss.append(doors.rss_kib())
    report(run, time.monotonic() - started, args.json)
    return 1 if any(t.crashed or t.hangs for t in run.tallies.values()) else 0


def report(run: Run, seconds: float, path: str) -> None:
    load = os.getloadavg()
    print(f"\n{'door':<20}{'cases':>9}{'wrong':>8}{'hangs':>8}{'not ready':>11}  crashed")
    for name, t in run.tallies.items():
        print(f"{name:<20}{t.cases:>9}{t.wrong:>8}{t.hangs:>8}{t.not_ready:>11}  {'YES' if t.crashed else 'no'}")
        for text in t.examples:
            print(f"    {text}")
    total = sum(t.cases for t in run.tallies.values())
    print(f"{'all':<20}{total:>9}  in {seconds:.0f} s")
    print(
        f"gateway RSS: start {run.rss[0] // 1024} MiB, largest {max(run.rss) // 1024} MiB, end {run.rss[-1] // 1024} MiB"
    )
    print(f"load average: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} ({os.cpu_count()} CPUs)")
    if path:
        doc = {"tallies": {n: asdict(t) for n, t in run.tallies.items()}, "rss_kib": run.rss, "seconds": seconds}
        Path(path).write_text(json.dumps({**doc, "load": load}, indent=2))


if __name__ == "__main__":
    sys.exit(main())

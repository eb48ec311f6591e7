"""Resource soak (issue 47, item 1; docs/reliability.md, "Soak"): does anything grow under a long
mixed load? (benchmarks/soak.py is the chaos soak: faults under load.)

    python benchmarks/soak_resources.py --minutes 22             # the figures in docs/reliability.md
    python benchmarks/soak_resources.py --minutes 2 --sample-s 5  # about what the CI test runs

Starts `shoal serve` on free ports (explicit model control, client shared memory allowed) on a
repository written here (benchmarks/soak_repository.py), then for `--minutes` drives a paced load
(benchmarks/soak_load.py: HTTP JSON and binary, gRPC, python and onnxruntime models, dynamic
batching, a sequence, an ensemble, a decoupled gRPC stream, client system shared memory
registered and unregistered), unloads and loads a model again every `--reload-s` (mlp and
py_double in turn), and every `--sample-s` samples every process of the serve (benchmarks/
soak_sampler.py), /dev/shm and nats-server (its Go heap through its profiling port, turned on
here: SHOAL_NATS_PROFILE_PORT; `--gomemlimit` and `--memprofilerate` set GOMEMLIMIT and GODEBUG
for it). Writes soak.csv, soak.png (with matplotlib), soak.json and nats-server's two heap
profiles into `--out`, prints the summary and exits 1 when a threshold is crossed: a process
kind's RSS grown by more than `--rss-growth-pct` after the warm-up (`--warmup`, a fraction of the
run), fds, threads or /dev/shm entries growing, a failure no reload explains.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tritonclient.http as httpclient  # noqa: E402

from benchmarks import nats_heap, soak_load, soak_report, soak_sampler  # noqa: E402
from benchmarks.soak_load import describe  # noqa: E402
from benchmarks.soak_report import Reload, Thresholds  # noqa: E402
from benchmarks.soak_repository import write_repository  # noqa: E402
from shared.process.natsserver import PROFILE_PORT_ENV, free_port  # noqa: E402
from tests.serving import Serve  # noqa: E402

RELOADED = ("mlp", "py_double")  # in turn: an onnxruntime session, then a python model's process


@dataclass
class Settings:
    minutes: float
    sample_s: float = 60.0
    warmup: float = 0.1  # the share of the run before the baseline
    rate: float = 5.0  # requests (a sequence, a shm round) per second, per kind of load
    reload_s: float = 30.0
    out: Path | None = None  # the CSV, plot and JSON (default: the work directory)
    limits: Thresholds = field(default_factory=Thresholds)
    nats_profile: bool = True  # the embedded nats-server's profiling port (loopback): its Go heap sampled
    profile_at_s: float = 600.0  # when the first heap profile is kept (the second: at the end)
    gomemlimit: str = ""  # GOMEMLIMIT for the serve's processes (only nats-server, a Go program, reads it)
    memprofilerate: int = 0  # GODEBUG=memprofilerate: bytes per heap profile sample (Go's default 512 KiB)


@dataclass
class Run:
    serve: Serve
    settings: Settings
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)  # no sample in the middle of a reload
    reloads: list[Reload] = field(default_factory=list)
    rows: list[soak_sampler.Row] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    run_id: str = ""  # the serve's SHOAL_RUN_ID: its /dev/shm segments carry it
    profile_port: int = 0  # nats-server's, when Settings.nats_profile
    heap: dict[str, str] = field(default_factory=dict)  # its heap profiles' text by when they were taken

    @property
    def root(self) -> int:
        """The pid of `shoal serve` (its tree is what is sampled)."""
        assert self.serve.process is not None, "the serve is started first"
        return self.serve.process.pid

    def reloader(self) -> None:
        """Every `reload_s`, the next of RELOADED unloaded and loaded again."""
        client = httpclient.InferenceServerClient(self.serve.url, network_timeout=300, connection_timeout=300)
        for turn in itertools.count():
            if self.stop.wait(self.settings.reload_s):
                break
            with self.lock:
                self.reloads.append(_reload(client, RELOADED[turn % len(RELOADED)]))
        client.close()

    def sampler(self) -> None:
        """A sample every `sample_s` from the start, and one at the end (the load still on)."""
        seconds = self.settings.minutes * 60
        due = 0.0
        while True:
            with self.lock:
                at = time.monotonic() - self.began
                self.rows += soak_sampler.sample(at, self.root, self.run_id, self.serve.monitor_port, self.profile_port)
            self.keep_heap(at, seconds)
            if at >= seconds:
                return
            due = min(due + self.settings.sample_s, seconds)
            self.stop.wait(max(0.0, due - (time.monotonic() - self.began)))

    def keep_heap(self, at: float, seconds: float) -> None:
        """nats-server's heap profile (after a GC: the live heap) at `profile_at_s` and at the end."""
        if not self.profile_port:
            return
        if at >= min(self.settings.profile_at_s, seconds / 2) and "early" not in self.heap:
            self.heap["early"] = f"# at {at:.0f} s\n" + nats_heap.fetch(self.profile_port, collect=True)
        if at >= seconds:
            self.heap["end"] = f"# at {at:.0f} s\n" + nats_heap.fetch(self.profile_port, collect=True)


def _reload(client: httpclient.InferenceServerClient, model: str) -> Reload:
    began = time.monotonic()
    try:
        client.unload_model(model)
        client.load_model(model)
        return Reload(model, began, time.monotonic())
    except Exception as exc:  # a refused unload or load: reported, and a failure of the soak
        return Reload(model, began, time.monotonic(), describe(exc))


def serve_args(models: Path) -> list[str]:
    return [f"--model-repository={models}", "--model-control-mode=explicit", "--load-model=*", "--allow-client-shm"]


def run(settings: Settings, workdir: Path | None = None) -> dict[str, Any]:
    """The soak; its summary (`violations` empty when nothing crossed a threshold)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="shoal-resource-soak-"))
    out = settings.out or workdir
    out.mkdir(parents=True, exist_ok=True)
    environment = _environment(settings)
    serve = Serve(workdir / "serve", serve_args(write_repository(workdir / "models")), environment=environment)
    profile_port = int(environment.get(PROFILE_PORT_ENV, 0))
    load_before = os.getloadavg()
    try:
        soak, tallies = _drive(Run(serve.start(), settings, profile_port=profile_port))
    finally:
        stop_s = _stop(serve)
    shm_left = soak_sampler.shm_rows(soak.run_id)
    summary = _summary(soak, tallies, load_before, out)
    summary.update(stop_s=stop_s, shm_left_after_stop=shm_left["server_entries"] + shm_left["client_entries"])
    if summary["shm_left_after_stop"]:
        summary["violations"].append(f"/dev/shm: {summary['shm_left_after_stop']} entries left after the stop")
    (out / "soak.json").write_text(json.dumps(summary, indent=2))
    return summary


def _environment(settings: Settings) -> dict[str, str]:
    """What the serve is given besides this process's environment: nats-server's profiling port,
    GOMEMLIMIT and GODEBUG's memprofilerate (a finer heap profile: Go's default samples one
    allocation per 512 KiB, too coarse to attribute a few MiB of growth)."""
    rate = f"memprofilerate={settings.memprofilerate}" if settings.memprofilerate else ""
    port = str(free_port()) if settings.nats_profile else ""
    chosen = {PROFILE_PORT_ENV: port, "GOMEMLIMIT": settings.gomemlimit, "GODEBUG": rate}
    return {name: value for name, value in chosen.items() if value}


def _drive(soak: Run) -> tuple[Run, list[soak_load.Tally]]:
    serve = soak.serve
    soak.run_id = soak_sampler.run_id(soak.root)
    grpc_url = f"127.0.0.1:{serve.grpc_port}"
    tallies, threads = soak_load.start(serve.url, grpc_url, soak.settings.rate, soak.stop)
    reloader = threading.Thread(target=soak.reloader, name="reloader", daemon=True)
    reloader.start()
    try:
        soak.sampler()
    finally:
        soak.stop.set()
        for thread in [*threads, reloader]:
            thread.join(300)
    return soak, tallies


def _stop(serve: Serve) -> float | None:
    """A clean stop (its scratch directories and segments go with it); None if it had to be killed."""
    if serve.process is None or serve.process.poll() is not None:
        return None
    try:
        return round(serve.terminate(60), 1)
    except AssertionError:
        return None


def _summary(soak: Run, tallies: list[soak_load.Tally], load_before: tuple[float, ...], out: Path) -> dict[str, Any]:
    settings = soak.settings
    soak_report.write_csv(soak.rows, out / "soak.csv")
    table = soak_report.resources(soak.rows, settings.warmup * settings.minutes * 60)
    asked = soak_report.requests(tallies, soak.reloads, soak.began)
    return {
        "minutes": settings.minutes,
        "load_average": [round(v, 1) for v in (*load_before, *os.getloadavg())],
        "samples": len({row[0] for row in soak.rows}),
        "settings": {k: v for k, v in asdict(settings).items() if k != "out"},
        "resources": table,
        "requests": asked,
        "reloads": len(soak.reloads),
        "reload_errors": [f"{r.model}: {r.error}" for r in soak.reloads if r.error],
        "violations": soak_report.violations(table, asked, settings.limits)
        + [f"reload of {r.model} failed: {r.error}" for r in soak.reloads if r.error],
        "csv": str(out / "soak.csv"),
        "nats_heap": _heap(soak, out),
        "plot": str(soak_report.plot(soak.rows, out / "soak.png") or ""),
    }


def _heap(soak: Run, out: Path) -> dict[str, Any]:
    """Each heap profile kept (raw, beside the CSV) and its top allocation sites in use."""
    found: dict[str, Any] = {}
    for when, text in soak.heap.items():
        (out / f"nats-heap-{when}.txt").write_text(nats_heap.in_use_only(text))
        found[when] = {"memstats": nats_heap.memstats(text), "top": nats_heap.top(text)}
    if len(soak.heap) == 2:  # what grew between them: [where, KiB early, KiB at the end]
        found["grown"] = nats_heap.grown(soak.heap["early"], soak.heap["end"])
    return found


def parse(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sample-s", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=0.1, help="share of the run before the baseline")
    parser.add_argument("--rate", type=float, default=5.0, help="per second, per kind of load")
    parser.add_argument("--reload-s", type=float, default=30.0)
    parser.add_argument("--rss-growth-pct", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-nats-profile", action="store_true", help="leave nats-server's profiling port off")
    parser.add_argument("--profile-at-s", type=float, default=600.0, help="the first nats-server heap profile")
    parser.add_argument("--gomemlimit", default="", help="GOMEMLIMIT for the embedded nats-server (64MiB)")
    parser.add_argument("--memprofilerate", type=int, default=0, help="bytes per Go heap profile sample")
    args = parser.parse_args(argv)
    limits = Thresholds(rss_growth_pct=args.rss_growth_pct)
    return Settings(
        args.minutes,
        args.sample_s,
        args.warmup,
        args.rate,
        args.reload_s,
        args.out,
        limits,
        not args.no_nats_profile,
        args.profile_at_s,
        args.gomemlimit,
        args.memprofilerate,
    )


def main() -> None:
    summary = run(parse())
    print(soak_report.text(summary))
    print(f"csv: {summary['csv']}\nplot: {summary['plot'] or '(no matplotlib)'}")
    sys.exit(1 if summary["violations"] else 0)


if __name__ == "__main__":
    main()

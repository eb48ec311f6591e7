"""The resource soak's samples (benchmarks/soak_resources.py): every process of a `shoal serve`
tree by kind (RSS, PSS and the RSS's shared part from psutil's memory_full_info, open file
descriptors, threads), its /dev/shm segments and the client's, and the embedded nats-server's own
view (/varz, /jsz on its monitor port; its Go heap's MemStats when its profiling port is on). A
sample is a list of rows (seconds since the start, kind, metric, value)."""

from __future__ import annotations

import glob
import json
import os
import urllib.request
from collections.abc import Iterable

import psutil

from benchmarks import nats_heap
from benchmarks.soak_load import SHM_PREFIX

Row = tuple[float, str, str, float]
ROLES = ("gateway", "scheduler", "worker", "repository")
PROCESS_METRICS = ("rss_kib", "pss_kib", "shared_kib", "fds", "threads", "processes")


def kind_of(process: psutil.Process, root: int) -> str:
    """serve (the supervisor), gateway, scheduler, worker, repository, nats-server, zygote, or
    `python <model>` for a python model's process (it names itself py<i>:<model>)."""
    if process.pid == root:
        return "serve"
    name, command = process.name(), " ".join(process.cmdline())
    if name == "nats-server":
        return "nats-server"
    if name.startswith("py") and ":" in name:
        return f"python {name.split(':', 1)[1]}"
    if "zygote" in command:
        return "zygote"
    return next((role for role in ROLES if f"shoal.cli {role} " in command), "other")


def measure(process: psutil.Process) -> dict[str, float]:
    memory = process.memory_full_info()
    return {
        "rss_kib": memory.rss / 1024,
        "pss_kib": memory.pss / 1024,
        "shared_kib": memory.shared / 1024,  # of the RSS, file pages (the binary, libraries) and shared memory
        "fds": process.num_fds(),
        "threads": process.num_threads(),
        "processes": 1,
    }


def tree(root: int) -> list[psutil.Process]:
    top = psutil.Process(root)
    return [top, *top.children(recursive=True)]


def processes_by_kind(root: int) -> dict[str, dict[str, float]]:
    """Each metric summed over the processes of a kind (one that exits while read is left out)."""
    kinds: dict[str, dict[str, float]] = {}
    for process in tree(root):
        try:
            kind, figures = kind_of(process, root), measure(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        into = kinds.setdefault(kind, dict.fromkeys(PROCESS_METRICS, 0.0))
        for metric, value in figures.items():
            into[metric] += value
    return kinds


def run_id(root: int) -> str:
    """The serve's SHOAL_RUN_ID (its segments are /dev/shm/shoal_<run id>_*), from a child's environment."""
    for process in tree(root)[1:]:
        try:
            found = process.environ().get("SHOAL_RUN_ID")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if found:
            return found
    raise RuntimeError("no process of the serve has SHOAL_RUN_ID")


def shm_rows(serve_run_id: str) -> dict[str, float]:
    """The serve's segments and the load's own client regions: entries and KiB."""
    figures: dict[str, float] = {}
    for label, pattern in (("server", f"shoal_{serve_run_id}_*"), ("client", f"{SHM_PREFIX}*")):
        paths = glob.glob(f"/dev/shm/{pattern}")
        figures[f"{label}_entries"] = len(paths)
        figures[f"{label}_kib"] = sum(_size(p) for p in paths) / 1024
    return figures


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:  # gone between the listing and the stat
        return 0


def nats_rows(monitor_port: int) -> dict[str, float]:
    """nats-server's memory and subscriptions (/varz) and JetStream's usage (/jsz)."""
    varz, jsz = (_monitor(monitor_port, endpoint) for endpoint in ("varz", "jsz"))
    figures = {"varz_mem_kib": varz["mem"] / 1024, "subscriptions": varz["subscriptions"]}
    figures["connections"] = varz["connections"]
    for key in ("memory", "storage", "streams", "consumers", "messages"):
        figures[f"js_{key}"] = jsz.get(key, 0)
    return figures


def _monitor(port: int, endpoint: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{endpoint}", timeout=10) as response:
        return json.load(response)


def go_heap_rows(profile_port: int) -> dict[str, float]:
    """nats-server's Go heap (runtime.MemStats from its profiling port): HeapAlloc is the heap in
    use plus garbage not collected yet, HeapIdle what the runtime holds unused, HeapReleased the
    part of that handed back to the OS, NextGC the heap size that starts the next GC (about twice
    the live heap of the last one)."""
    return nats_heap.sample_rows(nats_heap.memstats(nats_heap.fetch(profile_port)))


def sample(at: float, root: int, serve_run_id: str, monitor_port: int, profile_port: int = 0) -> list[Row]:
    """One sample of everything, `at` seconds into the run (nats-server's Go heap with a `profile_port`)."""
    rows: list[Row] = []
    for kind, figures in sorted(processes_by_kind(root).items()):
        rows += _rows(at, kind, figures.items())
    rows += _rows(at, "dev_shm", shm_rows(serve_run_id).items())
    rows += _rows(at, "nats", nats_rows(monitor_port).items())
    if profile_port:
        rows += _rows(at, "nats_go", go_heap_rows(profile_port).items())
    return rows


def _rows(at: float, kind: str, figures: Iterable[tuple[str, float]]) -> list[Row]:
    return [(round(at, 1), kind, metric, round(float(value), 1)) for metric, value in figures]

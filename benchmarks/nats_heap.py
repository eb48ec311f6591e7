"""nats-server's Go heap as its profiling port tells it (benchmarks/soak_resources.py; the port is
opt-in: SHOAL_NATS_PROFILE_PORT, shared/process/natsserver.py). `/debug/pprof/heap?debug=1` is Go's
text heap profile: a record per allocation stack (`inuse objects: inuse bytes [alloc objects:
alloc bytes] @ addresses`, then one `#\\taddress\\tfunction+offset\\tfile:line` line per frame),
then `# runtime.MemStats` as `# Name = value` lines. No Go toolchain is needed to read it."""

from __future__ import annotations

import math
import re
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

MEMSTATS = ("HeapAlloc", "HeapInuse", "HeapIdle", "HeapReleased", "Sys", "NextGC")  # bytes
COUNTS = ("NumGC",)
_HEADER = re.compile(r"heap profile: .* @ heap/(\d+)")
_RECORD = re.compile(r"(\d+): (\d+) \[(\d+): (\d+)\] @")
_STAT = re.compile(r"# (\w+) = (\d+)$")


@dataclass
class Site:
    """An allocation stack's in-use bytes and objects (scaled up from the sampled counts, as pprof
    does), with its frames' functions, innermost first."""

    inuse_bytes: float
    inuse_objects: float
    frames: list[str]

    @property
    def where(self) -> str:
        """The first frame outside Go's allocator: the code that asked for the memory."""
        return next((f for f in self.frames if not _allocator(f)), self.frames[0] if self.frames else "?")


def _allocator(function: str) -> bool:
    return function.startswith("runtime.") and not function.startswith("runtime.malg")


def fetch(port: int, collect: bool = False, host: str = "127.0.0.1") -> str:
    """The heap profile's text; `collect` has the server run a GC first (the in-use figures are
    then the live heap now, not as of the last GC)."""
    url = f"http://{host}:{port}/debug/pprof/heap?debug=1{'&gc=1' if collect else ''}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode(errors="replace"))


def memstats(text: str) -> dict[str, int]:
    """The `# runtime.MemStats` section's integer fields (`# HeapAlloc = 123`)."""
    _, found, section = text.partition("# runtime.MemStats")
    if not found:
        raise ValueError("no '# runtime.MemStats' section in the heap profile")
    stats = {}
    for line in section.splitlines():
        match = _STAT.match(line.strip())
        if match:
            stats[match.group(1)] = int(match.group(2))
    missing = [name for name in (*MEMSTATS, *COUNTS) if name not in stats]
    if missing:
        raise ValueError(f"heap profile's MemStats lacks {', '.join(missing)}")
    return stats


def sample_rows(stats: dict[str, int]) -> dict[str, float]:
    """The soak's CSV metrics: the byte fields in KiB (heap_alloc_kib, …), num_gc as is."""
    rows = {f"{_snake(name)}_kib": stats[name] / 1024 for name in MEMSTATS}
    rows.update({_snake(name): float(stats[name]) for name in COUNTS})
    return rows


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()


def sites(text: str) -> list[Site]:
    """Every record of the profile with something in use."""
    header = _HEADER.search(text)
    rate = int(header.group(1)) / 2 if header else 512 * 1024  # `heap/<2 × MemProfileRate>`
    found: list[Site] = []
    for line in text.split("# runtime.MemStats")[0].splitlines():
        match = _RECORD.match(line)
        if match:
            objects, size = int(match.group(1)), int(match.group(2))
            scale = 1 / (1 - math.exp(-size / objects / rate)) if objects and size else 0.0
            found.append(Site(size * scale, objects * scale, []))
        elif found and line.startswith("#\t") and line.count("\t") >= 2:
            found[-1].frames.append(line.split("\t")[2].rsplit("+", 1)[0])
    return [site for site in found if site.inuse_bytes]


def top(text: str, count: int = 15) -> list[dict[str, object]]:
    """In-use bytes by the code that allocated them (Site.where), largest first, each with the
    three frames above it in its largest stack."""
    by_where: dict[str, list[Site]] = defaultdict(list)
    for site in sites(text):
        by_where[site.where].append(site)
    ranked = sorted(by_where.items(), key=lambda item: -sum(s.inuse_bytes for s in item[1]))
    rows: list[dict[str, object]] = []
    for where, group in ranked[:count]:
        largest = max(group, key=lambda s: s.inuse_bytes)
        above = largest.frames[largest.frames.index(where) + 1 :][:3] if where in largest.frames else []
        kib = sum(s.inuse_bytes for s in group) / 1024
        rows.append({"where": where, "inuse_kib": round(kib, 1), "objects": round(sum(s.inuse_objects for s in group))})
        rows[-1]["callers"] = above
    return rows


def in_use_by_where(text: str) -> dict[str, float]:
    """In-use KiB by the code that allocated it (Site.where)."""
    found: dict[str, float] = defaultdict(float)
    for site in sites(text):
        found[site.where] += site.inuse_bytes / 1024
    return dict(found)


def grown(early: str, end: str, count: int = 10) -> list[tuple[str, float, float]]:
    """The allocation sites whose bytes in use grew most from one profile to the other:
    (where, KiB early, KiB at the end), the largest growth first."""
    before, after = in_use_by_where(early), in_use_by_where(end)
    ranked = sorted(after, key=lambda where: before.get(where, 0.0) - after[where])
    return [(where, round(before.get(where, 0.0), 1), round(after[where], 1)) for where in ranked[:count]]


def in_use_only(text: str) -> str:
    """The profile without its records of nothing in use (freed since: most of them), to keep."""
    head, found, stats = text.partition("# runtime.MemStats")
    kept: list[str] = []
    keep = True
    for line in head.splitlines():
        record = _RECORD.match(line)
        if record:
            keep = record.group(2) != "0"
        if keep:
            kept.append(line)
    return "\n".join(kept).rstrip("\n") + "\n\n\n" + found + stats

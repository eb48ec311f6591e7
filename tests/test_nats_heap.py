"""benchmarks/nats_heap.py reads nats-server's Go heap profile (`/debug/pprof/heap?debug=1`): the
runtime.MemStats fields the resource soak samples, and the allocation sites in use."""

from __future__ import annotations

import math

import pytest

from benchmarks import nats_heap

# Captured from nats-server 2.15.1's profiling port during a soak (tabs as it writes them), cut to
# three records (stacks shortened) and the MemStats section (its PauseNs/PauseEnd arrays shortened).
SAMPLE = """heap profile: 7: 276960 [27: 303152] @ heap/1048576
0: 0 [3: 384] @ 0x489433 0x420a65 0x85cb96 0x8578c8
#\t0x85cb95\tgithub.com/nats-io/nats-server/v2/server.(*client).processMsgResults+0x235\t\tgithub.com/nats-io/nats-server/v2/server/client.go:5383
#\t0x8578c7\tgithub.com/nats-io/nats-server/v2/server.(*client).processInboundClientMsg+0xae7\tgithub.com/nats-io/nats-server/v2/server/client.go:4578

1: 48 [1: 48] @ 0x48936f 0x420a65 0x4896fa 0x48970f 0xb9331f 0xb9334d 0xb37877
#\t0xb9331e\tgithub.com/nats-io/nats-server/v2/server.newNode+0x21e\t\t\t\t\t\tgithub.com/nats-io/nats-server/v2/server/sublist.go:107
#\t0xb9334c\tgithub.com/nats-io/nats-server/v2/server.(*Sublist).Insert-range1+0x24c\t\t\t\tgithub.com/nats-io/nats-server/v2/server/sublist.go:405
#\t0xb37876\tstrings.splitSeq.func1+0x216\t\t\t\t\t\t\t\t\tstrings/iter.go:59

1: 480 [1: 480] @ 0x489425 0x420a65 0x45ac05 0x45adb9 0x484385 0x4912ca
#\t0x489424\truntime.mallocgc+0x104\t\truntime/malloc.go:1131
#\t0x420a64\truntime.newobject+0x24\t\truntime/malloc.go:2141
#\t0x45ac04\truntime.malg+0x24\t\truntime/proc.go:5313
#\t0x45adb8\truntime.newproc1+0x78\t\truntime/proc.go:5361


# runtime.MemStats
# Alloc = 2795632
# TotalAlloc = 14849072
# Sys = 22456600
# Lookups = 0
# Mallocs = 136088
# Frees = 117447
# HeapAlloc = 2795632
# HeapSys = 15663104
# HeapIdle = 10174464
# HeapInuse = 5488640
# HeapReleased = 7405568
# HeapObjects = 18641
# Stack = 1114112 / 1114112
# MSpan = 108960 / 130560
# MCache = 4592 / 16072
# BuckHashSys = 1448146
# GCSys = 3456768
# OtherSys = 627838
# NextGC = 5901922
# LastGC = 1796614109080476686
# PauseNs = [78446 670826 218319 99696 690192 379741 83466 0 0 0]
# PauseEnd = [1796614046867256109 1796614048892842401 1796614059070617143 0 0]
# NumGC = 7
# NumForcedGC = 2
# GCCPUFraction = 7.69248119050785e-05
# DebugGC = false
# MaxRSS = 58609664
"""


def test_the_memstats_section_gives_the_heap_fields_in_bytes():
    stats = nats_heap.memstats(SAMPLE)
    assert stats["HeapAlloc"] == 2795632 and stats["HeapInuse"] == 5488640
    assert stats["HeapIdle"] == 10174464 and stats["HeapReleased"] == 7405568
    assert stats["Sys"] == 22456600 and stats["NextGC"] == 5901922 and stats["NumGC"] == 7
    assert "Stack" not in stats and "PauseNs" not in stats  # `a / b` and arrays are not one integer


def test_the_soak_rows_are_kib_and_the_gc_count():
    rows = nats_heap.sample_rows(nats_heap.memstats(SAMPLE))
    assert rows["heap_alloc_kib"] == 2795632 / 1024 and rows["heap_released_kib"] == 7405568 / 1024
    assert rows["next_gc_kib"] == 5901922 / 1024 and rows["sys_kib"] == 22456600 / 1024
    assert rows["num_gc"] == 7.0
    assert set(rows) == {
        f"{n}_kib" for n in ("heap_alloc", "heap_inuse", "heap_idle", "heap_released", "sys", "next_gc")
    } | {"num_gc"}


def test_a_profile_without_memstats_or_a_field_is_refused():
    with pytest.raises(ValueError, match="no '# runtime.MemStats'"):
        nats_heap.memstats(SAMPLE.split("# runtime.MemStats")[0])
    with pytest.raises(ValueError, match="NextGC"):
        nats_heap.memstats(SAMPLE.replace("# NextGC = 5901922\n", ""))


def test_sites_in_use_are_scaled_up_from_the_sampled_counts_and_named_by_the_code_that_allocated():
    found = nats_heap.sites(SAMPLE)
    assert len(found) == 2  # the record with nothing in use is left out
    sublist, goroutine = found
    rate = 1048576 / 2  # `heap/<2 × MemProfileRate>`
    assert math.isclose(sublist.inuse_bytes, 48 / (1 - math.exp(-48 / rate)))
    assert sublist.where == "github.com/nats-io/nats-server/v2/server.newNode"
    assert sublist.frames[2] == "strings.splitSeq.func1"
    assert goroutine.where == "runtime.malg"  # a goroutine's stack: Go's own, not its allocator


def test_top_ranks_by_bytes_in_use_with_the_callers():
    rows = nats_heap.top(SAMPLE)
    assert [r["where"] for r in rows] == ["runtime.malg", "github.com/nats-io/nats-server/v2/server.newNode"]
    assert rows[1]["callers"] == [
        "github.com/nats-io/nats-server/v2/server.(*Sublist).Insert-range1",
        "strings.splitSeq.func1",
    ]
    assert rows[0]["inuse_kib"] > rows[1]["inuse_kib"] > 500  # one sampled object stands for ~512 KiB


def test_grown_ranks_the_sites_by_growth_between_two_profiles():
    later = SAMPLE.replace("1: 48 [1: 48] @", "3: 144 [3: 144] @")  # three sampled nodes in use, not one
    (where, before, after), *_ = nats_heap.grown(SAMPLE, later)
    assert where == "github.com/nats-io/nats-server/v2/server.newNode"
    assert math.isclose(after, 3 * before, rel_tol=1e-3)
    assert all(before == after for _, before, after in nats_heap.grown(SAMPLE, SAMPLE))


def test_in_use_only_drops_the_freed_records_and_keeps_the_rest_readable():
    kept = nats_heap.in_use_only(SAMPLE)
    assert "processMsgResults" not in kept and "server.newNode" in kept and "runtime.malg" in kept
    assert kept.startswith("heap profile: 7: 276960")
    assert nats_heap.memstats(kept) == nats_heap.memstats(SAMPLE)
    assert nats_heap.top(kept) == nats_heap.top(SAMPLE)

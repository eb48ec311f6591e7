"""shared/wire/statistics.py: the Structs encode to the statistics extension's JSON as Triton
writes it (names and order, docs/triton-spec.md §1.10), and the reply survives the bus."""

from __future__ import annotations

import msgspec

from shared.wire.messages import encode
from shared.wire.statistics import (
    BatchStats,
    Duration,
    Latency,
    ModelStatistics,
    SchedulerStatistics,
    StepStats,
    VersionStatistics,
)

_ZERO = '{"count":0,"ns":0}'


def test_an_all_zero_entry_is_tritons_document():
    expected = (
        '{"name":"m","version":"2","last_inference":0,"inference_count":0,"execution_count":0,"inference_stats":{'
        + ",".join(
            f'"{k}":{_ZERO}'
            for k in (
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            )
        )
        + '},"response_stats":{},"batch_stats":[],"memory_usage":[]}'
    )
    assert msgspec.json.encode(ModelStatistics("m", "2")).decode() == expected


def test_ensemble_steps_appear_last_and_only_when_set():
    entry = ModelStatistics("e", "1", batch_stats=[BatchStats(2, compute_infer=Duration(1, 9))])
    assert b"ensemble_steps" not in msgspec.json.encode(entry)
    assert '"batch_stats":[{"batch_size":2,"compute_input":{"count":0,"ns":0},"compute_infer":{"count":1,"ns":9},' in (
        msgspec.json.encode(entry).decode()
    )
    entry.ensemble_steps = {"pre": StepStats(Duration(1, 5))}
    assert msgspec.json.encode(entry).endswith(
        b'"memory_usage":[],"ensemble_steps":{"pre":{"success":{"count":1,"ns":5},"fail":{"count":0,"ns":0}}}}'
    )
    assert msgspec.to_builtins(entry)["ensemble_steps"]["pre"]["success"] == {"count": 1, "ns": 5}


def test_a_reply_round_trips_as_messagepack():
    reply = SchedulerStatistics(
        {
            "m/1": VersionStatistics(
                ModelStatistics("m", "1", ensemble_steps={"s": StepStats()}),
                fail_reasons={"REJECTED": 2},
                latency=Latency({"request": {"0.5": 1.25}}, [100.0], [1, 0], 3.5),
            ),
            "n/2": VersionStatistics(ModelStatistics("n", "2")),
        }
    )
    decoded = msgspec.msgpack.decode(encode(reply), type=SchedulerStatistics)
    assert decoded == reply and decoded.versions["n/2"].stats.ensemble_steps is msgspec.UNSET

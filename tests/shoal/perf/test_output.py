from __future__ import annotations

import csv

from shoal.perf.measure import ClientStats, LevelResult, ServerStats
from shoal.perf.output import table, write_csv

# what perf_analyzer 2.41 writes with -f and --verbose-csv (checked against the binary)
PERF_ANALYZER_COLUMNS = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait"
).split(",")


def level(concurrency: int, throughput: float) -> LevelResult:
    client = ClientStats(100, 1.0, throughput, 5000.0, {50: 4000.0, 90: 6000.0, 95: 7000.0, 99: 9000.0}, 50.0, 20.0)
    server = ServerStats(100, 200, 50, 300.0, 100.0, 2000.0, 50.0)
    return LevelResult("concurrency", concurrency, client, server, True, 3)


def test_csv_has_perf_analyzers_columns_sorted_by_throughput(tmp_path):
    path = tmp_path / "out.csv"
    write_csv([level(1, 200.0), level(2, 150.0)], path)
    with open(path) as f:
        rows = list(csv.DictReader(f))
        f.seek(0)
        header = next(csv.reader(f))
    assert header[: len(PERF_ANALYZER_COLUMNS)] == PERF_ANALYZER_COLUMNS
    assert [r["Concurrency"] for r in rows] == ["2", "1"]
    row = rows[0]
    assert row["Server Queue"] == "300" and row["Server Compute Infer"] == "2000"
    # the rest of the average is the network's and the server's send/receive, as perf_analyzer splits it
    assert row["Network+Server Send/Recv"] == str(5000 - 50 - 20 - 300 - 100 - 2000 - 50)
    assert row["request/response"] == "70" and row["response wait"] == "4930"
    assert row["Avg Batch Size"] == "4.0"


def test_table_marks_unstable_levels():
    unstable = level(4, 10.0)
    unstable.stable = False
    text = table([level(1, 200.0), unstable])
    assert "4*" in text and "not stable" in text

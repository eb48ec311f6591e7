"""The resource soak's short version (benchmarks/soak_resources.py, two minutes of mixed load with a
model reloaded every 15 s): open fds, threads and /dev/shm entries of every process kind flat after
a 30 s warm-up, every failure explained by a reload, the run's /dev/shm entries gone after the stop
(docs/reliability.md, "Soak"). RSS over two minutes is noise-prone on a busy 2-core machine (the
first onnxruntime and python batches, allocator pools filling): only a loose bound, 20 %, here; the
5 % verdict is for the long runs. Looser still for the worker, 60 %: its onnxruntime sessions, made
again by a reload every 15 s, raise its allocator's high-water mark in steps for the first minutes
(118 -> 127 -> 143 MiB in one run, 145 -> 191 MiB in another, at load 2); the 2-hour run found it
flat after ten minutes (+0.09 %)."""

from __future__ import annotations

import pytest

pytest.importorskip("psutil", reason="the soak samples with psutil: pip install '.[test]'")

from benchmarks.soak_report import Thresholds  # noqa: E402
from benchmarks.soak_resources import Settings, run  # noqa: E402


@pytest.mark.timeout(600)
def test_two_minutes_of_mixed_load_leave_resources_flat(tmp_path):
    settings = Settings(
        minutes=2,
        sample_s=5,
        warmup=0.25,
        rate=3,
        reload_s=15,
        out=tmp_path / "out",
        limits=Thresholds(20.0, {"worker": 60.0}),
    )
    summary = run(settings, workdir=tmp_path)
    print(summary)
    assert summary["violations"] == [], summary["violations"]
    assert all(t["ok"] > 0 for t in summary["requests"].values()), summary["requests"]
    assert summary["reloads"] >= 6 and not summary["reload_errors"], summary["reload_errors"]
    assert summary["shm_left_after_stop"] == 0

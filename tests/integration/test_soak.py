"""The chaos soak's short version (benchmarks/soak.py, about a minute): every fault in turn under
mixed load; no request outlives its deadline, every failure is a clear error, serving recovers
after each fault and nothing is left in /dev/shm (docs/reliability.md)."""

from __future__ import annotations

import pytest

from benchmarks.soak import run


@pytest.mark.timeout(420)
def test_a_minute_of_chaos(tmp_path):
    summary = run(60, workdir=tmp_path)
    print(summary)
    assert summary["hung"] == 0, summary
    assert summary["succeeded"] > 0 and summary["failed_clear"] == summary["sent"] - summary["succeeded"], summary
    assert summary["shm_left"] == 0, summary
    unrecovered = [name for name, seconds in summary["recovery_s"] if seconds is None]
    assert not unrecovered, summary["recovery_s"]
    assert all("no error text" not in key for key in summary["bad_bodies"]), summary["bad_bodies"]
    assert not summary["fault_errors"], summary["fault_errors"]

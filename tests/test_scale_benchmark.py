"""benchmarks/scale.py's plan: which cores each (workers, gateways) run gets (pure logic)."""

import pytest

from benchmarks.scale import Config, plan, range_of


def test_n_workers_get_2n_cores_and_the_client_the_last_ones() -> None:
    runs = plan([1, 6], ["same", "1"], 16, 2, 4, total=16)
    assert runs == [
        Config(1, 1, "0-1", "12-15", 16),
        Config(6, 6, "0-11", "12-15", 96),
        Config(6, 1, "0-11", "12-15", 96),
    ]
    assert len(range_of(runs[1].server_cpus)) == 12


def test_no_pinning_leaves_the_cpu_lists_empty() -> None:
    assert plan([2], ["same"], 8, 2, 4, total=None) == [Config(2, 2, "", "", 16)]


def test_a_run_whose_cores_overlap_the_client_is_refused() -> None:
    with pytest.raises(SystemExit, match="7 workers"):
        plan([7], ["same"], 16, 2, 4, total=16)

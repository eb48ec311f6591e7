"""The soak's verdict (benchmarks/soak_report.py): what counts as growth."""

from __future__ import annotations

from benchmarks.soak_report import Thresholds, violations


def _table(worker_rss: float, gateway_rss: float, client_entries: float) -> dict:
    return {
        "worker": {"rss_kib": {"growth": worker_rss}},
        "gateway": {"rss_kib": {"growth": gateway_rss}},
        "dev_shm": {"client_entries": {"growth": client_entries}, "server_entries": {"growth": 0.0}},
    }


def test_a_kind_may_have_its_own_rss_bound():
    limits = Thresholds(20.0, {"worker": 60.0})
    assert violations(_table(31.5, 5.0, 0.0), {}, limits) == []
    assert violations(_table(61.0, 21.0, 0.0), {}, limits) == [
        "worker: RSS +61.0 % after the warm-up",
        "gateway: RSS +21.0 % after the warm-up",
    ]


def test_the_load_s_one_shared_memory_region_in_flight_is_not_growth():
    """The client's register/infer/unregister loop holds one region at a time: present at some
    samples and not others, its median moves by up to one. Two at once would be a leak."""
    assert violations(_table(0.0, 0.0, 1.0), {}, Thresholds()) == []
    assert violations(_table(0.0, 0.0, 1.5), {}, Thresholds()) == ["dev_shm client_entries +1.5"]

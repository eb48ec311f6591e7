from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.analyze.configs import Candidate, apply, candidate_of, to_pbtxt
from shoal.analyze.search import Limits, QuickSearch, neighbours
from tests.shoal.analyze.pbtxt import parse_pbtxt

MLP = {
    "name": "mlp",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 64,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [256]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "instance_group": [{"name": "mlp_0", "count": 2, "kind": "KIND_CPU"}],
    "dynamic_batching": {"preferred_batch_size": [64], "max_queue_delay_microseconds": 500},
}


def test_candidate_round_trips_through_the_config():
    c = candidate_of(MLP)
    assert c == Candidate(2, 64, True, 500, (64,))
    changed = Candidate(3, 32, False)
    config = apply(MLP, changed)
    assert candidate_of(config) == changed and config["input"] == MLP["input"]
    assert "dynamic_batching" not in config and MLP["dynamic_batching"]  # the original is untouched


def test_pbtxt_is_triton_text_format():
    text = to_pbtxt(apply(MLP, Candidate(4, 16, True, 100, (16,))))
    assert 'name: "mlp"' in text and "count: 4" in text and "max_queue_delay_microseconds: 100" in text
    assert candidate_of(parse_pbtxt(text)) == Candidate(4, 16, True, 100, (16,))


def test_neighbours_grow_one_coordinate_within_limits():
    limits = Limits(max_instances=3, max_batch_size=64)
    assert neighbours(Candidate(3, 64, True, 10000, (64,)), limits) == []
    assert neighbours(Candidate(1, 0, False), limits) == [Candidate(2, 0, False)]  # no batching: instances only
    assert Candidate(1, 8, True, 0) in neighbours(Candidate(1, 8, False), limits)


def climb(surface, start: Candidate, limits: Limits) -> tuple[Candidate, int]:
    search = QuickSearch(start, limits)
    tried = 0
    while (c := search.next()) is not None:
        search.record(c, surface(c))
        tried += 1
    best = search.best()
    assert best is not None
    return best[0], tried


def test_climbs_to_the_peak_of_a_single_peaked_surface():
    def surface(c: Candidate) -> float:  # best at 3 instances, batch 32, dynamic batching, 1 ms
        return (
            1000
            - 100 * abs(c.instances - 3)
            - 50 * abs(c.max_batch_size.bit_length() - 6)
            + (100 if c.dynamic_batching else 0)
            - abs(c.max_queue_delay_us - 1000) / 2
        )

    best, tried = climb(surface, Candidate(1, 4, False), Limits(5, 128))
    assert (best.instances, best.max_batch_size, best.dynamic_batching, best.max_queue_delay_us) == (3, 32, True, 1000)
    assert tried < 40  # a climb, not the whole grid (5 x 6 x 8 x 2)


@given(st.integers(1, 5), st.sampled_from([0, 1, 2, 4, 8, 16]), st.booleans(), st.integers(0, 2**31))
def test_search_ends_and_never_repeats_or_leaves_the_limits(instances, batch, dynamic, seed):
    limits = Limits(5, 16)
    search = QuickSearch(Candidate(instances, batch, dynamic and batch > 0), limits)
    seen = set()
    while (c := search.next()) is not None:
        assert c not in seen and c.instances <= 5 and c.max_batch_size <= 16
        seen.add(c)
        search.record(c, float(hash((c, seed)) % 1000))
    assert seen

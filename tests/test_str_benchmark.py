"""benchmarks/str_model.py builds the tutorial's STR model; str_table.py renders what it measured."""

import numpy as np
import onnxruntime as ort

from benchmarks.str_model import STR_CLASSES, STR_INPUT, STR_OUTPUT, STR_SEQ, STR_SHAPE, build_str
from benchmarks.str_table import CONCURRENCIES, render


def test_the_str_model_reads_a_text_line_batch_into_one_class_score_per_step():
    session = ort.InferenceSession(build_str(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((3, *STR_SHAPE), dtype=np.float32)
    (y,) = session.run([STR_OUTPUT], {STR_INPUT: x})
    assert y.shape == (3, STR_SEQ, STR_CLASSES)
    (first,) = session.run([STR_OUTPUT], {STR_INPUT: x[:1]})
    np.testing.assert_allclose(first[0], y[0], rtol=1e-4, atol=1e-5)  # rows do not leak into each other


def test_a_level_that_did_not_settle_shows_as_n_a_and_the_others_as_ratios():
    ok = [{"concurrency": c, "throughput": 10.0 * c, "p95_us": 1000.0} for c in CONCURRENCIES]
    shoal = [dict(row, throughput=row["throughput"] / 2) for row in ok]
    failed = [{"concurrency": 2, "error": "unstable"}, *ok[1:]]
    runs = {"triton": [failed], "shoal": [shoal], "shoal native": [ok]}
    lines = render({"_dyn": runs}, lambda v: "n/a" if v is None else f"{v:g}")
    row2 = next(line for line in lines if line.startswith("| 2 |"))
    row4 = next(line for line in lines if line.startswith("| 4 |"))
    assert "n/a" in row2
    assert row4.endswith("| 0.5× | 1× |")

"""A DALI pipeline's outputs as each request's answer, `split_along_outer_axis` included.

Triton's DALI backend (docs/config.md of dali_backend, `split_along_outer_axis`): the parameter
is a colon-separated list of output names; each of their samples, shaped (n_i, d_1, ..., d_D),
is split along its outer dimension into n_i samples shaped (d_1, ..., d_D). A request's output
is then every sample of its own rows, split: shaped (sum of its n_i, d_1, ..., d_D). The other
outputs answer one sample per row, as any batched model's.
"""

from __future__ import annotations

import numpy as np

from shared.errors import internal

SEPARATOR = ":"


def outputs_to_split(parameter: str) -> set[str]:
    """The output names of `split_along_outer_axis` (DALI's separator; empty names dropped)."""
    return {name for name in parameter.split(SEPARATOR) if name}


def split_request(name: str, samples: list[np.ndarray]) -> np.ndarray:
    """One request's output of a split output: its samples' outer dimensions as its batch."""
    if any(sample.ndim < 2 for sample in samples):
        # DALI's words (split_outer_dim, whose check is on the samples' dimensions: a split sample keeps one)
        raise internal(f"output '{name}': To split outer dimension, the batch must be at least 2-dimensional.")
    inner = {sample.shape[1:] for sample in samples}
    if len(inner) > 1:
        shapes = ", ".join(str(list(shape)) for shape in sorted(inner))
        raise internal(
            f"output '{name}': the samples split along the outer axis have different shapes ({shapes}); "
            "a response's tensor needs one"
        )
    return np.concatenate(samples, axis=0)


def dense(name: str, samples: list[np.ndarray]) -> np.ndarray:
    """The samples of an output that is not split, as one batch (their shapes must agree)."""
    if len({sample.shape for sample in samples}) > 1:
        raise internal(f"the DALI pipeline's output '{name}' has samples of different shapes")
    return np.stack(samples)


def per_request(
    samples: dict[str, list[np.ndarray]], batch_sizes: list[int], split: set[str]
) -> list[dict[str, np.ndarray]]:
    """Each request's outputs from the pipeline's samples (one per row, requests in order)."""
    answers: list[dict[str, np.ndarray]] = [{} for _ in batch_sizes]
    start = 0
    for answer, size in zip(answers, batch_sizes):
        for name, outputs in samples.items():
            own = outputs[start : start + size]
            answer[name] = split_request(name, own) if name in split else dense(name, own)
        start += size
    return answers

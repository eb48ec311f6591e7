"""The dynamic batcher forms batches from concurrent requests (visible in the statistics)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http.aio as aioclient

from tests.cluster import DEFAULT_SHAPE, Running, running_cluster


@pytest.fixture(scope="module")
def shoal(test_repository, shape, shoal) -> Iterator[Running]:
    """The shared cluster's models, in each cluster shape (`shape`): in the default shape the shared
    cluster itself (the same models; the statistics are compared before and after), one start fewer."""
    if shape == DEFAULT_SHAPE:
        yield shoal
        return
    with running_cluster(test_repository, shape=shape) as running:
        yield running


def batch_counts(stats: dict) -> dict[int, int]:
    entry = stats["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}


async def infer_many(url: str, model: str, count: int, width: int = 4) -> list[np.ndarray]:
    client = aioclient.InferenceServerClient(url, conn_limit=count)
    try:

        async def one(i: int) -> np.ndarray:
            tensor = aioclient.InferInput("INPUT0", [1, width], "FP32")
            tensor.set_data_from_numpy(np.full((1, width), i, np.float32))
            return (await client.infer(model, [tensor])).as_numpy("OUTPUT0")

        return await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()


async def test_eight_concurrent_requests_run_as_one_execution(shoal):
    client = aioclient.InferenceServerClient(shoal.url)
    try:
        before = await client.get_inference_statistics("batch_probe")
        results = await infer_many(shoal.url, "batch_probe", 8)
        after = await client.get_inference_statistics("batch_probe")
    finally:
        await client.close()
    for i, result in enumerate(results):  # each request got its own slice back
        np.testing.assert_array_equal(result, np.full((1, 4), i, np.float32))
    entry_before, entry_after = before["model_stats"][0], after["model_stats"][0]
    assert entry_after["execution_count"] == entry_before["execution_count"] + 1
    assert entry_after["inference_count"] == entry_before["inference_count"] + 8
    assert batch_counts(after).get(8, 0) == batch_counts(before).get(8, 0) + 1


async def test_incompatible_shapes_are_not_batched_together(shoal):
    client = aioclient.InferenceServerClient(shoal.url)
    try:
        before = (await client.get_inference_statistics("batch_probe"))["model_stats"][0]
        wide, narrow = await asyncio.gather(
            infer_many(shoal.url, "batch_probe", 4, width=6), infer_many(shoal.url, "batch_probe", 4, width=2)
        )
        after = (await client.get_inference_statistics("batch_probe"))["model_stats"][0]
    finally:
        await client.close()
    assert all(r.shape == (1, 6) for r in wide) and all(r.shape == (1, 2) for r in narrow)
    assert after["inference_count"] == before["inference_count"] + 8
    assert after["execution_count"] >= before["execution_count"] + 2


async def test_default_scheduler_keeps_client_batches(shoal):
    """`simple` has no dynamic_batching: each request runs as sent."""
    client = aioclient.InferenceServerClient(shoal.url)
    try:
        before = (await client.get_inference_statistics("simple"))["model_stats"][0]
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = aioclient.InferInput(name, [3, 16], "INT32")
            tensor.set_data_from_numpy(np.ones((3, 16), np.int32))
            inputs.append(tensor)
        await asyncio.gather(*(client.infer("simple", inputs) for _ in range(4)))
        after = (await client.get_inference_statistics("simple"))["model_stats"][0]
    finally:
        await client.close()
    assert after["execution_count"] == before["execution_count"] + 4
    assert batch_counts({"model_stats": [after]})[3] == batch_counts({"model_stats": [before]}).get(3, 0) + 4


async def test_preserve_ordering_model_answers_every_request(shoal):
    results = await infer_many(shoal.url, "ordered", 24)
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full((1, 4), i, np.float32))

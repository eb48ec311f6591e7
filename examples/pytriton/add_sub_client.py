"""add_sub's client: one sample (infer_sample adds and removes the batch axis) and a batch."""

import os

import numpy as np

from shoal.pytriton.client import ModelClient

url = os.environ.get("PYTRITON_URL", "localhost:8000")
a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
b = np.array([0.5, 0.5, 0.5], dtype=np.float32)

with ModelClient(url, "AddSub", init_timeout_s=60) as client:
    sample = client.infer_sample(a, b)
    batch = client.infer_batch(a=np.stack([a, b]), b=np.stack([b, a]))

print("add", sample["add"].tolist(), "sub", sample["sub"].tolist())
print("batch add", batch["add"].tolist())

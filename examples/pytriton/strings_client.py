"""The string model's client: numpy bytes arrays in and out."""

import os

import numpy as np

from shoal.pytriton.client import ModelClient

url = os.environ.get("PYTRITON_URL", "localhost:8000")
with ModelClient(url, "Upper", init_timeout_s=60) as client:
    result = client.infer_sample(text=np.array([b"hello", "wörld".encode()], dtype=np.object_))
print([item.decode() for item in result["upper"]])

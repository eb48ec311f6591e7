"""The streaming model's client: DecoupledModelClient yields each response as it arrives."""

import os

import numpy as np

from shoal.pytriton.client import DecoupledModelClient

url = os.environ.get("PYTRITON_URL", "localhost:8000")
with DecoupledModelClient(url, "Words", init_timeout_s=60) as client:
    for response in client.infer_sample(prompt=np.array([b"shoal serves python functions"], dtype=np.object_)):
        print(int(response["index"][0]), response["word"][0].decode())

"""PyTriton's quick-start client, imports changed: a batch of 128 through ModelClient."""

import os

import torch

from shoal.pytriton.client import ModelClient

url = os.environ.get("PYTRITON_URL", "localhost:8000")
input1_data = torch.randn(128, 2).cpu().detach().numpy()

with ModelClient(url, "Linear") as client:
    result_dict = client.infer_batch(input1_data)

print(result_dict["OUTPUT_1"].shape)

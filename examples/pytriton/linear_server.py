"""PyTriton's quick-start, imports changed to shoal.pytriton: a torch Linear layer served as "Linear".

python examples/pytriton/linear_server.py      # then: python examples/pytriton/linear_client.py
"""

import numpy as np
import torch

from shoal.pytriton.decorators import batch
from shoal.pytriton.model_config import ModelConfig, Tensor
from shoal.pytriton.triton import Triton

model = torch.nn.Linear(2, 3).to("cpu").eval()


@batch
def infer_fn(**inputs: np.ndarray):
    (input1_batch,) = inputs.values()
    input1_batch_tensor = torch.from_numpy(input1_batch).to("cpu")
    output1_batch_tensor = model(input1_batch_tensor)
    output1_batch = output1_batch_tensor.cpu().detach().numpy()
    return [output1_batch]


with Triton() as triton:
    triton.bind(
        model_name="Linear",
        infer_func=infer_fn,
        inputs=[Tensor(dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=128),
    )
    triton.serve()

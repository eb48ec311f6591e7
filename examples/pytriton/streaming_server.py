"""A decoupled model: a generator streams one response per word (HTTP /generate_stream, gRPC streams).

curl -N -d '{"prompt": "shoal serves python functions"}' localhost:8000/v2/models/Words/generate_stream
"""

import numpy as np

from shoal.pytriton.decorators import batch
from shoal.pytriton.model_config import ModelConfig, Tensor
from shoal.pytriton.triton import Triton


@batch
def words(prompt: np.ndarray):
    texts = [item.decode("utf-8") for item in prompt.reshape(-1)]
    split = [text.split() for text in texts]
    for step in range(max(len(s) for s in split)):  # one response per step to every request of the batch
        yield {
            "word": np.array([[s[step] if step < len(s) else ""] for s in split], dtype=np.bytes_),
            "index": np.array([[step] for _ in split], dtype=np.int32),
        }


with Triton() as triton:
    triton.bind(
        model_name="Words",
        infer_func=words,
        inputs=[Tensor(name="prompt", dtype=bytes, shape=(1,))],
        outputs=[Tensor(name="word", dtype=bytes, shape=(1,)), Tensor(name="index", dtype=np.int32, shape=(1,))],
        config=ModelConfig(max_batch_size=8, decoupled=True),
    )
    triton.serve()

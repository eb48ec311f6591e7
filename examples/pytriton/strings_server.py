"""A string (BYTES) model: upper-cases UTF-8 text, one output per input element."""

import numpy as np

from shoal.pytriton.decorators import batch
from shoal.pytriton.model_config import ModelConfig, Tensor
from shoal.pytriton.triton import Triton


@batch
def upper(text: np.ndarray):
    decoded = np.char.decode(text.astype("bytes"), "utf-8")
    return {"upper": np.char.encode(np.char.upper(decoded), "utf-8")}


with Triton() as triton:
    triton.bind(
        model_name="Upper",
        infer_func=upper,
        inputs=[Tensor(name="text", dtype=bytes, shape=(-1,))],
        outputs=[Tensor(name="upper", dtype=bytes, shape=(-1,))],
        config=ModelConfig(max_batch_size=16),
    )
    triton.serve()

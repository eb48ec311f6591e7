"""Two-process scale-out: every copy of this script is one more worker for "Square".

    python examples/pytriton/scale_out_server.py                  # starts the cluster, logs its NATS URL
    python examples/pytriton/scale_out_server.py --nats-url URL --nats-credentials FILE   # joins it: a second worker

Each process answers with its own pid (output "pid"), so a client sees the load shared.
"""

import argparse
import logging
import os

import numpy as np

from shoal.pytriton.decorators import batch
from shoal.pytriton.model_config import ModelConfig, Tensor
from shoal.pytriton.triton import Triton, TritonConfig

parser = argparse.ArgumentParser()
parser.add_argument("--nats-url", default=None, help="join the cluster on this NATS (default: start one)")
parser.add_argument("--nats-credentials", default=None, help="with --nats-url: the worker identity it printed")
args = parser.parse_args()
logging.basicConfig(level=logging.INFO)


@batch
def square(x: np.ndarray):
    return {"y": x * x, "pid": np.full((x.shape[0], 1), os.getpid(), dtype=np.int64)}


with Triton(config=TritonConfig(nats_url=args.nats_url, nats_credentials=args.nats_credentials)) as triton:
    triton.bind(
        model_name="Square",
        infer_func=square,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,)), Tensor(name="pid", dtype=np.int64, shape=(1,))],
        config=ModelConfig(max_batch_size=32),
    )
    joining = f"--nats-url {triton.nats_url}" + (
        f" --nats-credentials {triton.nats_credentials}" if triton.nats_credentials else ""
    )
    print(f"serving Square; join with {joining}", flush=True)
    triton.serve()

#!/usr/bin/env python3
"""The gateway's own Python per HTTP request, in a loop: body split, request parse, validation and
response encoding (services/gateway/http/codec.py, inference/validation.py) on what
perf_analyzer sends to `identity_fp32` (16 FP32 values, binary tensor extension).

usage: python benchmarks/codec_loop.py [ITERATIONS]

Run it from a tree (`env -C TREE PYTHONPATH=TREE python benchmarks/codec_loop.py N`) to time that
tree's modules, compiled or not. Under `valgrind --tool=callgrind`, two runs with different N give
the instructions per request of exactly this code, free of the bus and of timing (docs/performance.md,
"Compiled code"). Without valgrind it prints µs per iteration.
"""

from __future__ import annotations

import struct
import sys
import time

from inference.types import OutputTensor
from inference.validation import validate
from services.gateway.http import codec
from shared.model_config import spec_from_json

SPEC = spec_from_json(
    {
        "name": "identity_fp32",
        "backend": "python",
        "max_batch_size": 64,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "dynamic_batching": {},
    }
)
DATA = struct.pack("<16f", *range(16))
HEADER = (
    b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","parameters":{"binary_data_size":64}}],'
    b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}'
)
BODY = HEADER + DATA


def one() -> None:
    header, binary = codec.split_body(BODY, str(len(HEADER)))
    parsed = codec.parse_request(header, binary, "identity_fp32")
    validate(SPEC, parsed)
    outputs = [OutputTensor("OUTPUT0", "FP32", [1, 16], DATA, True)]
    codec.encode_response("identity_fp32", 1, parsed.id, outputs)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    started = time.perf_counter()
    for _ in range(n):
        one()
    print(f"{(time.perf_counter() - started) / n * 1e6:.2f} us per iteration ({n} iterations)")


if __name__ == "__main__":
    main()

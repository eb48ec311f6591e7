#!/usr/bin/env python3
"""The gateway's own Python per HTTP request, in a loop: body split, request parse, validation and
response encoding (services/gateway/http/codec.py, inference/validation.py) on what
perf_analyzer sends to an identity model (binary tensor extension), or on a JSON request.

usage: python benchmarks/codec_loop.py [ITERATIONS] [--values N] [--datatype FP32|INT32]
           [--json] [--json-output]

By default the request is perf_analyzer's to `identity_fp32`: 16 FP32 values in the binary tensor
extension, the output asked for as binary. `--json` sends the input values as a JSON `data` array
instead (as curl, the README's examples and `tritonclient.http` with `binary_data=False` do);
`--json-output` asks for the output as a JSON array. `--values` and `--datatype` pick the tensor.

Run it from a tree (`env -C TREE PYTHONPATH=TREE python benchmarks/codec_loop.py N`) to time that
tree's modules, compiled or not. Under `valgrind --tool=callgrind`, two runs with different N give
the instructions per request of exactly this code, free of the bus and of timing (docs/performance.md,
"Compiled code" and "JSON input values"). Without valgrind it prints µs per iteration.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import orjson

from inference.types import OutputTensor
from inference.validation import validate
from services.gateway.http import codec
from shared.config.datatypes import numpy_dtype
from shared.config.model_config import spec_from_json


def request_loop(values: int, datatype: str, json_input: bool, json_output: bool) -> Callable[[], None]:
    """One request's gateway Python, as a callable on a body built once."""
    model = f"identity_{datatype.lower()}"
    spec = spec_from_json(
        {
            "name": model,
            "backend": "python",
            "max_batch_size": 64,
            "input": [{"name": "INPUT0", "data_type": f"TYPE_{datatype}", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": f"TYPE_{datatype}", "dims": [-1]}],
            "dynamic_batching": {},
        }
    )
    array = (np.arange(values) % 1000).astype(numpy_dtype(datatype))
    if datatype.startswith("FP"):
        array += 0.25  # JSON numbers with a fraction, as real data has
    data = array.tobytes()
    tensor: dict = {"name": "INPUT0", "shape": [1, values], "datatype": datatype}
    if json_input:
        tensor["data"] = array.tolist()
    else:
        tensor["parameters"] = {"binary_data_size": len(data)}
    header = orjson.dumps(
        {"inputs": [tensor], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": not json_output}}]}
    )
    body, length = (header, None) if json_input else (header + data, str(len(header)))

    def one() -> None:
        head, binary = codec.split_body(body, length)
        parsed = codec.parse_request(head, binary, model)
        validate(spec, parsed)
        outputs = [OutputTensor("OUTPUT0", datatype, [1, values], data, not json_output)]
        codec.encode_response(model, 1, parsed.id, outputs)

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("iterations", type=int, nargs="?", default=100_000)
    parser.add_argument("--values", type=int, default=16, help="values in the input tensor, shape [1, N]")
    parser.add_argument("--datatype", default="FP32", choices=["FP32", "INT32"])
    parser.add_argument("--json", action="store_true", help="the input values as a JSON data array")
    parser.add_argument("--json-output", action="store_true", help="the output asked for as JSON")
    args = parser.parse_args()
    one = request_loop(args.values, args.datatype, args.json, args.json_output)
    started = time.perf_counter()
    for _ in range(args.iterations):
        one()
    elapsed = time.perf_counter() - started
    print(f"{elapsed / args.iterations * 1e6:.2f} us per iteration ({args.iterations} iterations)")


if __name__ == "__main__":
    main()

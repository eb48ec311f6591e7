"""One part of a JSON request alone, in a loop: `orjson.loads` of the body or `json_tensor_bytes`.

usage: python parts2.py loads|tensor FP32|INT32 ITERATIONS VALUES (from a tree, under callgrind)"""

import sys

import numpy as np
import orjson

from services.gateway.http import codec

part, dt, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
vals = (np.arange(size) % 1000).astype(np.float32 if dt == "FP32" else np.int32)
if dt == "FP32":
    vals += 0.25
data = [vals.tolist()]
body = orjson.dumps({"inputs": [{"name": "I", "shape": [1, size], "datatype": dt, "data": data}]})
parts = {"loads": lambda: orjson.loads(body), "tensor": lambda: codec.json_tensor_bytes("I", dt, [1, size], data)}
for _ in range(n):
    parts[part]()

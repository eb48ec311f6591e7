import sys, numpy as np, orjson
from services.gateway.http import codec
part, dt, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
vals = (np.arange(size) % 1000).astype(np.float32 if dt == "FP32" else np.int32)
if dt == "FP32": vals += 0.25
data = [vals.tolist()]
body = orjson.dumps({"inputs":[{"name":"I","shape":[1,size],"datatype":dt,"data":data}]})
f = {"loads": lambda: orjson.loads(body), "tensor": lambda: codec.json_tensor_bytes("I", dt, [1,size], data)}[part]
for _ in range(n): f()

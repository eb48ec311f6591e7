#!/usr/bin/env python3
"""Instructions per request of the request's wire work, for an A/B of two trees under callgrind.

usage: PYTHONPATH=TREE valgrind --tool=callgrind python benchmarks/wire_cost.py N

Encodes a two-input `InferRequest` as the gateway does, decodes its `RequestHeader` as the
scheduler does and the whole request as the worker does, N times. Run it with N = 0 and N = 20000
for each tree: (total(20000) - total(0)) / 20000 is the wire's instructions per request, exact
and blind to the machine's load (docs/performance.md, "Tracing off costs nothing measurable").
"""

from __future__ import annotations

import sys

import msgspec

from shared.wire.messages import InferRequest, RequestHeader, TensorRef


def main(count: int) -> None:
    encoder = msgspec.msgpack.Encoder()
    header = msgspec.msgpack.Decoder(RequestHeader)
    request = msgspec.msgpack.Decoder(InferRequest)
    inputs = [TensorRef(name, "INT32", [1, 16], data=bytes(64)) for name in ("INPUT0", "INPUT1")]
    for i in range(count):
        raw = encoder.encode(
            InferRequest(
                rid=str(i), model="simple", version=1, reply="_INBOX.x.1", deadline_ns=1, inputs=inputs, received_ns=1
            )
        )
        header.decode(raw)
        request.decode(raw)


if __name__ == "__main__":
    main(int(sys.argv[1]))

"""PyTriton's API on Shoal: bind Python functions to model names and serve them.

A PyTriton script runs after replacing `pytriton.` with `shoal.pytriton.` in its imports.
The process that calls `Triton.bind` becomes a Shoal worker for its models, so the same
script started again with `TritonConfig(nats_url=...)` adds a worker behind the same
endpoint. See docs/pytriton.md.
"""

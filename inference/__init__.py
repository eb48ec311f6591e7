"""The inference core: a library, not a process (docs/architecture.md, step 2).

Transport-neutral: the gateway's front ends (HTTP, gRPC, OpenAI) and the python backend's BLS in
the worker call it to check a request against its model, build the wire request and read the
answer. It imports `shared/` and nothing from `services/`.
"""

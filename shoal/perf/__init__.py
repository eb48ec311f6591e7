"""`shoal perf`: a load generator that measures like Triton's perf_analyzer (docs/perf-and-analyze.md).

options (flags) -> inputs (tensors to send) -> transport (HTTP or gRPC, one Protocol) -> engine (load
levels, windows until stable) -> measure (pure statistics) -> output (CSV, table, plot).
"""

"""`shoal analyze`: search a model's configurations with the `shoal perf` engine (docs/perf-and-analyze.md).

configs (a candidate as a config override, config.pbtxt text) -> search (Model Analyzer's quick search as a
hill climb, pure) -> points (scores, Pareto front, pure) -> runner (loads candidates, measures, restores
the original) -> report (CSV, config.pbtxt, report.html).
"""

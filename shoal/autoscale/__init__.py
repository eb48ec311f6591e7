"""`shoal autoscale`: the worker count of a Docker deployment from its queues (docs/scaling.md)."""

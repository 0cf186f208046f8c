"""Benchmarks of maestro's own measurement (post-processing, aggregation, overhead, fidelity)."""

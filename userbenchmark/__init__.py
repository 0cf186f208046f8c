"""TorchBench-style userbenchmarks; each subpackage has a run.py with run(args)."""

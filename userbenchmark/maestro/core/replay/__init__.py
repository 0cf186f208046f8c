"""Import torch.profiler (Kineto) traces of a training step as a maestro pattern: ``import_traces``
reads one file per rank, ``emit`` writes the YAML and runs ``import-trace`` (``run_command``). It
needs the config layer (to validate what it writes) and the block registry, never the runtime."""

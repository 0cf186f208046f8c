"""Import torch.profiler (Kineto) traces of a training step as a maestro pattern: ``import_traces``
reads one file per rank, ``emit.render`` writes the YAML, ``command`` is ``import-trace``. It needs
the config layer (to validate what it writes) and the block registry, never the runtime."""

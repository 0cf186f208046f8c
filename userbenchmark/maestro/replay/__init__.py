"""Import torch.profiler (Kineto) traces of a training step as a maestro pattern.
``import_traces(paths)`` reads one trace file per rank and returns what the pattern file holds;
``emit.render`` writes it as YAML; ``command.import_trace`` is the ``import-trace`` command. The
package reads traces and writes YAML: it needs the config layer (to validate what it writes) and the
block registry, never the runtime."""

"""The cluster shell: launch, rendezvous, agreement at every phase boundary, supervision."""

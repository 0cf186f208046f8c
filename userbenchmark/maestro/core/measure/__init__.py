"""One rank's measurement: its patterns' phases, lanes, gate and windows (no agreement)."""

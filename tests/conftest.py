"""Test-suite settings shared by every test module."""

from __future__ import annotations

from hypothesis import settings

# Property tests check behaviour, never speed: hypothesis's per-example deadline (200 ms by
# default) fails on a loaded 2-core machine with the behaviour intact, so it is off for all.
settings.register_profile("maestro", deadline=None)
settings.load_profile("maestro")

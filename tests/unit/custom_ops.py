"""User-style custom blocks for tests: subclasses of built-ins, named in YAML by module path."""

from __future__ import annotations

from userbenchmark.maestro.blocks.comm import AllGather, AllReduce
from userbenchmark.maestro.blocks.compute import Gemm


class MyAllReduce(AllReduce):
    """A user's all_reduce (e.g. with another launch); its arithmetic is inherited."""


class MyAllGather(AllGather):
    """A user's all_gather."""


class MyGemm(Gemm):
    """A user's GEMM."""

"""Runs describe what they measured, and compare refuses runs that measured different things."""

from __future__ import annotations

import json

import pytest

from userbenchmark.maestro.core.config.loader import load_suite_text
from userbenchmark.maestro.core.config.options import RunOptions, apply_overrides
from userbenchmark.maestro.core.output.compare import (
    CompareError,
    SettingsDiffer,
    compare_files,
    format_compare_table,
)
from userbenchmark.maestro.core.output.reporter import (
    measurement_settings,
    setting_differences,
    stack_line,
    suite_settings,
)

SUITE = """
name: s
world_size: 2
defaults: {iters: 20, warmup_iters: 3}
patterns:
  - name: p
    blocks:
      - {name: ar, op: all_reduce, size: 1M}
      - {name: mm, op: gemm, lane: compute, m: 512, n: 512, k: 512}
"""


def test_suite_settings_hold_sizes_after_capping_and_iterations_after_overrides():
    suite = load_suite_text(SUITE, file="s.yaml")
    full = suite_settings(suite)
    assert full["pattern.p"] == "iters=20 warmup_iters=3 sync=barrier graph=false"
    assert full["block.p/ar"].startswith("op=all_reduce dtype=fp32 team_size=2 size=1M")
    capped = suite_settings(apply_overrides(suite, RunOptions(max_size_bytes=4096, iters=5)))
    assert "size=4K" in capped["block.p/ar"] and "m=512" not in capped["block.p/mm"]
    assert capped["pattern.p"].startswith("iters=5 ")
    differences = setting_differences(full, capped)
    assert [d.split(":")[0] for d in differences] == ["block.p/ar", "block.p/mm", "pattern.p"]


def test_only_measurement_settings_count_and_the_stack_is_shown():
    a = {"backend": "nccl", "world_size": "8", "nccl_version": "2.28.9", "hostname": "x"}
    b = {"backend": "nccl", "world_size": "8", "nccl_version": "2.32.3", "hostname": "y"}
    assert setting_differences(a, b) == []  # a new NCCL is what A/B compares
    assert measurement_settings(a) == {"backend": "nccl", "world_size": "8"}
    assert stack_line(b) == "NCCL 2.32.3"
    c = dict(b, world_size="4", ranks_per_gpu="1")
    assert setting_differences(a, c) == ["world_size: A '8', B '4'"]  # ranks_per_gpu: one side


def _metrics(path, environ, value=10.0):
    path.write_text(
        json.dumps(
            {"name": "maestro", "environ": environ, "metrics": {"s/p/ar/latency_avg_us": value}}
        )
    )
    return path


def test_compare_refuses_runs_with_different_settings_unless_forced(tmp_path):
    base = {"backend": "gloo", "profiler": "host", "world_size": "2", "pattern.p": "iters=20"}
    a = _metrics(tmp_path / "a.json", base)
    b = _metrics(tmp_path / "b.json", dict(base, max_size_bytes="4096"), value=30.0)
    same = _metrics(tmp_path / "c.json", dict(base, pytorch_version="2.13.0"), value=11.0)
    assert compare_files(a, same).setting_differences == ()
    b2 = _metrics(tmp_path / "b2.json", dict(base, **{"pattern.p": "iters=5"}, max_size_bytes="1"))
    with pytest.raises(SettingsDiffer) as err:
        compare_files(a, b2)
    assert "pattern.p: A 'iters=20', B 'iters=5'" in str(err.value) and "--force" in str(err.value)
    result = compare_files(a, b2, force=True)
    assert result.setting_differences == ("pattern.p: A 'iters=20', B 'iters=5'",)
    assert "WARNING: compared with --force" in format_compare_table(result)
    # max_size_bytes present on one side only is unknown on the other: not compared.
    assert compare_files(a, b).setting_differences == ()


def test_files_without_settings_are_refused_unless_forced_and_said_so(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"name": "maestro", "metrics": {"s/p/ar/latency_avg_us": 1.0}}))
    b = _metrics(tmp_path / "b.json", {"backend": "gloo"})
    for first, second in ((a, b), (b, a)):
        with pytest.raises(CompareError, match=f"{a}: records no settings.*--force"):
            compare_files(first, second)
    text = format_compare_table(compare_files(a, b, force=True))
    assert "A records no settings" in text

"""compare on two real runs: the same settings compare; a --max-size run against a full one
is refused with the difference named, and compared with a warning under --force."""

from __future__ import annotations

import pytest

from .helpers import run_maestro

pytestmark = pytest.mark.integration

PATTERN = """
name: cmp
world_size: 2
defaults: {warmup_iters: 1, iters: 5, baseline: false}
patterns:
  - name: ar
    blocks:
      - {name: ar, op: all_reduce, size: 64K}
"""


def _run(tmp_path, name, *extra):
    config = tmp_path / "cmp.yaml"
    config.write_text(PATTERN)
    out = tmp_path / name
    proc = run_maestro(
        [
            "run",
            "-c",
            str(config),
            "--nproc",
            "2",
            "--output-dir",
            str(out),
            "--no-metrics",
            *extra,
        ],
        timeout=300,  # a hang, not speed: each run takes seconds
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_a_capped_run_is_not_compared_with_a_full_one_unless_forced(tmp_path):
    full = _run(tmp_path, "full")
    again = _run(tmp_path, "again")
    capped = _run(tmp_path, "capped", "--max-size", "4K")
    same = run_maestro(["compare", str(full), str(again)])
    assert same.returncode in (0, 1), same.stderr
    assert "settings" not in same.stderr
    refused = run_maestro(["compare", str(full), str(capped)])
    assert refused.returncode == 2
    assert "max_size_bytes" in refused.stderr and "block.ar/ar" in refused.stderr
    assert "--force" in refused.stderr and "Traceback" not in refused.stderr
    forced = run_maestro(["compare", str(full), str(capped), "--force"])
    assert forced.returncode in (0, 1), forced.stderr
    assert "WARNING: compared with --force" in forced.stdout

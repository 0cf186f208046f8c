"""maestro's version is one constant in the package, and the packaging metadata reads it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import userbenchmark.maestro as maestro

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_knows_its_version():
    # TorchBench runs maestro from a checkout that was never installed: no '0+unknown' there.
    assert re.fullmatch(r"\d+\.\d+\.\d+", maestro.__version__), maestro.__version__


def test_packaging_metadata_reads_the_package_constant():
    pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml")
    config = pyprojecttoml.read_configuration(ROOT / "pyproject.toml")
    assert config["project"]["version"] == maestro.__version__
    # Declared dynamic, never a second literal that could drift from the package's.
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" in project["dynamic"] and "version" not in project


def test_the_version_needs_no_installed_package(tmp_path):
    # A fresh interpreter from a folder outside the checkout, with only the source tree on the
    # path, sees the same version (nothing comes from installed metadata).
    code = "import userbenchmark.maestro as m; print(m.__version__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,  # a hang, not speed: the import takes a second or two
    )
    assert done.stdout.strip() == maestro.__version__

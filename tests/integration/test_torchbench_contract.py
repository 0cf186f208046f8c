"""TorchBench contract: run_benchmark.py dispatch, metrics files, regression detector, install.

A minimal TorchBench stand-in (written here, not TorchBench's code) is built in tmp_path with
the userbenchmark package copied into it, and driven the way TorchBench drives a userbenchmark.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from userbenchmark.maestro import __version__ as maestro_version
from userbenchmark.maestro.core.output.metric_keys import parse_metric_key
from userbenchmark.maestro.install import cupti_requirement

from ..docblocks import bash_blocks
from .helpers import QUICK_HANG_S, RUN_HANG_S

REPO_ROOT = Path(__file__).resolve().parents[2]
MAESTRO_DIR = REPO_ROOT / "userbenchmark" / "maestro"
METRICS_NAME_RE = re.compile(r"metrics-\d{14}\.json")

# TorchBench's dispatcher: the first positional is the userbenchmark's folder name; every other
# argument, in order, goes to userbenchmark.<name>.run.run(args).
STANDIN_RUN_BENCHMARK = """
import argparse
import importlib
from pathlib import Path

UB_DIR = Path(__file__).resolve().parent / "userbenchmark"

if __name__ == "__main__":
    names = sorted(p.name for p in UB_DIR.iterdir() if p.is_dir() and p.name != "__pycache__")
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("bm_name", choices=names)
    known, rest = parser.parse_known_args()
    importlib.import_module(f"userbenchmark.{known.bm_name}.run").run(rest)
"""

# TorchBench's A/B result types: same class names, field names, order and defaults, mutable.
STANDIN_UTILS = """
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Union

REPO_PATH = Path(__file__).resolve().parent.parent
USERBENCHMARK_OUTPUT_PREFIX = ".userbenchmark"


@dataclass
class TorchBenchABTestMetric:
    control: Union[float, str]
    treatment: Union[float, str]
    delta: Union[float, str]


@dataclass
class TorchBenchABTestResult:
    name: str
    control_env: Dict[str, str]
    treatment_env: Dict[str, str]
    details: Dict[str, TorchBenchABTestMetric]
    control_only_metrics: Dict[str, float] = field(default_factory=dict)
    treatment_only_metrics: Dict[str, float] = field(default_factory=dict)
    bisection: str = "pytorch"
    bisection_mode: str = "bisect"
    bisection_config_file_path: Optional[str] = None
"""

# TorchBench's local-file regression detection: keep the shared keys, call the userbenchmark's
# detector, then overwrite the one-sided metrics on the returned object; dump with safe_dump.
STANDIN_REGRESSION_DETECTOR = """
import argparse
import importlib
import json
from dataclasses import asdict

import yaml

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("--treatment", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    with open(args.control) as f:
        control = json.load(f)
    with open(args.treatment) as f:
        treatment = json.load(f)
    assert control["name"] == treatment["name"], "different userbenchmarks"
    shared = control["metrics"].keys() & treatment["metrics"].keys()
    control_only = {k: v for k, v in control["metrics"].items() if k not in shared}
    treatment_only = {k: v for k, v in treatment["metrics"].items() if k not in shared}
    control["metrics"] = {k: control["metrics"][k] for k in shared}
    treatment["metrics"] = {k: treatment["metrics"][k] for k in shared}
    detector = importlib.import_module(f"userbenchmark.{control['name']}.regression_detector")
    result = detector.run(control, treatment)
    result.control_only_metrics = control_only
    result.treatment_only_metrics = treatment_only
    doc = asdict(result)
    doc["result_type"] = f"{type(result).__module__}.{type(result).__qualname__}"
    with open(args.output, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def _clean_env() -> dict[str, str]:
    """The test's environment without PYTHONPATH, so imports resolve inside the stand-in."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def _run(
    args: list[str], cwd: Path, timeout_s: float = QUICK_HANG_S
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _build_standin(root: Path) -> Path:
    """A TorchBench-shaped tree at ``root`` with maestro copied in as a userbenchmark."""
    _write(root / "run_benchmark.py", STANDIN_RUN_BENCHMARK)
    _write(root / "regression_detector.py", STANDIN_REGRESSION_DETECTOR)
    _write(root / "userbenchmark" / "__init__.py", "")
    _write(root / "userbenchmark" / "utils.py", STANDIN_UTILS)
    shutil.copytree(
        MAESTRO_DIR,
        root / "userbenchmark" / "maestro",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return root


def _detect(standin: Path, control: Path, treatment: Path, out: Path) -> dict:
    proc = _run(
        [
            "regression_detector.py",
            "--control",
            str(control),
            "--treatment",
            str(treatment),
            "--output",
            str(out),
        ],
        cwd=standin,
    )
    assert proc.returncode == 0, f"stand-in regression detector failed:\n{proc.stderr[-4000:]}"
    return yaml.safe_load(out.read_text())


def _check_result_shape(result: dict) -> None:
    assert result["result_type"] == "userbenchmark.utils.TorchBenchABTestResult"
    assert result["name"] == "maestro"
    for field in ("control_env", "treatment_env", "details"):
        assert isinstance(result[field], dict), field
    for metric in result["details"].values():
        assert set(metric) == {"control", "treatment", "delta"}


# --- run_benchmark.py (this repository's dispatcher) ------------------------------------------


@pytest.fixture
def dispatcher_tree(tmp_path: Path) -> Path:
    """This repo's run_benchmark.py beside two fake userbenchmarks (one that cannot import)."""
    shutil.copy(REPO_ROOT / "run_benchmark.py", tmp_path / "run_benchmark.py")
    ub = tmp_path / "userbenchmark"
    _write(ub / "__init__.py", "")
    _write(ub / "fake" / "__init__.py", "")
    _write(
        ub / "fake" / "run.py",
        """
        import json

        def run(args):
            if args[:1] == ["exit"]:
                raise SystemExit(int(args[1]))
            if args[:1] == ["boom"]:
                raise RuntimeError("boom")
            print(json.dumps(args))
        """,
    )
    _write(ub / "broken" / "__init__.py", "")
    _write(ub / "broken" / "run.py", "import module_that_does_not_exist_xyz\n")
    _write(ub / "notabench" / "README", "no package here\n")
    return tmp_path


def test_dispatch_passes_remaining_args_in_order(dispatcher_tree: Path):
    proc = _run(["run_benchmark.py", "fake", "-c", "quickstart", "--nproc", "2"], dispatcher_tree)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["-c", "quickstart", "--nproc", "2"]


def test_dispatch_unknown_or_missing_name_lists_benchmarks(dispatcher_tree: Path):
    for args in (["nosuch"], []):
        proc = _run(["run_benchmark.py", *args], dispatcher_tree)
        assert proc.returncode == 2
        assert "available userbenchmarks: broken, fake" in proc.stderr
    proc = _run(["run_benchmark.py", "--help"], dispatcher_tree)
    assert proc.returncode == 0
    assert "fake" in proc.stdout


def test_dispatch_never_hides_failures(dispatcher_tree: Path):
    proc = _run(["run_benchmark.py", "fake", "exit", "3"], dispatcher_tree)
    assert proc.returncode == 3
    proc = _run(["run_benchmark.py", "fake", "boom"], dispatcher_tree)
    assert proc.returncode == 1
    assert "RuntimeError: boom" in proc.stderr
    proc = _run(["run_benchmark.py", "broken"], dispatcher_tree)
    assert proc.returncode == 1
    assert "ModuleNotFoundError" in proc.stderr


# --- install.py, requirements.txt, ci.yaml ----------------------------------------------------


@pytest.mark.parametrize(
    ("cuda", "requirement"),
    [
        ("13.0", "cupti-python>=13,<14"),
        ("12.8", "cupti-python>=12,<13"),
        ("12", "cupti-python>=12,<13"),
        (None, None),
        ("", None),
    ],
)
def test_cupti_requirement_matches_cuda_major(cuda, requirement):
    assert cupti_requirement(cuda) == requirement


def test_cupti_requirement_rejects_garbage():
    with pytest.raises(ValueError):
        cupti_requirement("cuda")


def test_install_runs_as_torchbench_runs_it():
    # TorchBench runs `python install.py [its own options]` with cwd = the userbenchmark folder.
    proc = _run(["install.py", "--dry-run", "--continue_on_fail"], MAESTRO_DIR)
    assert proc.returncode == 0, proc.stderr
    commands = [shlex.split(line) for line in proc.stdout.splitlines() if line]
    assert commands, proc.stdout
    assert commands[0][-3:] == ["-r", str(MAESTRO_DIR / "requirements.txt"), "matplotlib>=3.6"]
    for command in commands:
        assert command[1:4] == ["-m", "pip", "install"]
        assert not any(re.match(r"torch\b", token) for token in command), command
    # Only a CUDA build of torch gets a cupti-python install.
    import torch

    assert any("cupti-python" in c[-1] for c in commands) == bool(torch.version.cuda)


def test_requirements_are_lower_bounds_without_torch():
    lines = [
        line.strip()
        for line in (MAESTRO_DIR / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    names = set()
    for line in lines:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+>=[0-9][0-9.]*", line), line
        names.add(line.split(">=")[0].lower())
    assert names == {"pyyaml", "tabulate", "pandas", "numpy", "click"}


def test_ci_yaml_has_torchbench_shape():
    ci = yaml.safe_load((MAESTRO_DIR / "ci.yaml").read_text())
    assert set(ci) == {"platform", "schedule"}
    assert ci["platform"] in ("gcp_a100", "aws_t4_metal")
    assert ci["schedule"] == "nightly"


# --- regression detector inside a TorchBench stand-in (synthetic files) -----------------------


def _metrics_doc(metrics: dict[str, float]) -> dict:
    return {
        "name": "maestro",
        # A GPU run's settings: the detector refuses a file without them.
        "environ": {"pytorch_git_version": "abc", "pytorch_version": "2.13.0", "profiler": "cupti"},
        "metrics": metrics,
    }


def test_detector_uses_torchbench_types_when_called_by_torchbench(tmp_path: Path):
    standin = _build_standin(tmp_path / "tb")
    lat = "quickstart/ag_rs/allgather/latency_avg_us"
    bw = "quickstart/ag_rs/allgather/busbw_gbps"
    control = tmp_path / "control.json"
    treatment = tmp_path / "treatment.json"

    def measured(values: dict[str, float]) -> dict[str, float]:
        out = dict(values)
        for key, value in values.items():  # a 95 % interval of +-1 % over 30 degrees of freedom
            out |= {f"{key}_ci_low": value * 0.99, f"{key}_ci_high": value * 1.01}
            out[f"{key}_ci_df"] = 30.0
        return out

    control.write_text(
        json.dumps(_metrics_doc(measured({lat: 100.0, bw: 50.0}) | {"q/p/old_us": 1.0}))
    )
    treatment.write_text(
        json.dumps(_metrics_doc(measured({lat: 130.0, bw: 60.0}) | {"q/p/new_us": 1.0}))
    )
    result = _detect(standin, control, treatment, tmp_path / "regression.yaml")
    _check_result_shape(result)
    assert set(result["details"]) == {lat}
    assert result["details"][lat]["delta"] == pytest.approx(0.3)
    assert result["control_only_metrics"] == {"q/p/old_us": 1.0}
    assert result["treatment_only_metrics"] == {"q/p/new_us": 1.0}
    assert result["control_env"]["git_commit_hash"] == "abc"


# --- the whole contract with maestro's real run.py (integration) ------------------------------


def _require_run_py() -> None:
    if not (MAESTRO_DIR / "run.py").is_file():
        pytest.fail(
            "userbenchmark/maestro/run.py is missing: TorchBench imports "
            "userbenchmark.maestro.run and calls run(args: list[str])"
        )


@pytest.mark.integration
def test_repo_run_benchmark_lists_maestro():
    _require_run_py()
    proc = _run(["run_benchmark.py", "no-such-benchmark"], REPO_ROOT)
    assert proc.returncode == 2
    assert "maestro" in proc.stderr


def running_command() -> list[str]:
    """docs/torchbench.md's command under "Running" (``python run_benchmark.py maestro ...``)."""
    page = REPO_ROOT / "docs" / "torchbench.md"
    heading = page.read_text().splitlines().index("### Running") + 1
    (command,) = next(b for b in bash_blocks(page) if b.line > heading).commands
    words = shlex.split(command)
    assert words[:3] == ["python", "run_benchmark.py", "maestro"], command
    return words[1:]


@pytest.mark.integration
def test_torchbench_runs_maestro_and_detects_regressions(tmp_path: Path):
    _require_run_py()
    standin = _build_standin(tmp_path / "tb")
    repo_output = REPO_ROOT / ".userbenchmark" / "maestro"
    before = set(repo_output.glob("metrics-*.json")) if repo_output.is_dir() else set()

    # The documented command, with few iterations: the contract (where the file goes, what it
    # holds, what the detector makes of it) is what is tested here.
    command = [*running_command(), "--iters", "20", "--warmup-iters", "1", "--no-baseline"]
    proc = _run(command, cwd=standin, timeout_s=RUN_HANG_S)
    assert proc.returncode == 0, (
        f"`python {shlex.join(command)}` exited {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    )

    # Written under the stand-in root (the folder holding run_benchmark.py), nowhere else.
    out_dir = standin / ".userbenchmark" / "maestro"
    (path,) = out_dir.glob("metrics-*.json")
    after = set(repo_output.glob("metrics-*.json")) if repo_output.is_dir() else set()
    assert after == before, "the run wrote metrics into this repository instead of the stand-in"
    assert METRICS_NAME_RE.fullmatch(path.name), path.name
    doc = json.loads(path.read_text())
    assert doc["name"] == "maestro"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in doc["environ"].items())
    # TorchBench's regression detector, abtest and uploader read these two.
    assert {"pytorch_git_version", "pytorch_version"} <= set(doc["environ"])
    # A TorchBench checkout is never installed: the version still comes from the package.
    assert doc["environ"]["maestro_version"] == maestro_version
    metrics = doc["metrics"]
    assert metrics, f"{path.name} has no metrics"
    for key, value in metrics.items():
        parse_metric_key(key)
        assert type(value) is float and math.isfinite(value), (key, value)
    assert any(parse_metric_key(k).metric == "latency_avg_us" for k in metrics)
    # A second run's file under TorchBench's naming (two runs never share a name: unit-tested).
    files = [path, out_dir / "metrics-29991231235959.json"]
    shutil.copy2(path, files[1])

    result = _detect(standin, files[0], files[1], tmp_path / "ab.yaml")
    _check_result_shape(result)
    assert result["control_only_metrics"] == {} and result["treatment_only_metrics"] == {}

    # A latency twenty times as long (its interval with it: beyond the noise of 20 gloo
    # iterations on a loaded machine) must come back as a regression of exactly that key.
    def width(key: str) -> float:
        return (metrics[f"{key}_ci_high"] - metrics[f"{key}_ci_low"]) / metrics[key]

    key = min((k for k in metrics if k.endswith("/latency_avg_us")), key=width)
    slower = json.loads(files[1].read_text())
    for name in (key, f"{key}_ci_low", f"{key}_ci_high"):
        slower["metrics"][name] *= 20.0
    slower_path = tmp_path / "slower.json"
    slower_path.write_text(json.dumps(slower))
    result = _detect(standin, files[1], slower_path, tmp_path / "slower.yaml")
    _check_result_shape(result)
    assert set(result["details"]) == {key}
    assert result["details"][key]["delta"] == pytest.approx(19.0)

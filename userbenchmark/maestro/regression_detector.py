"""TorchBench's A/B hook: its ``regression_detector.py`` calls ``run(control, treatment)`` with
two parsed metrics files, judged as ``compare`` judges them (core/output/metric_keys.py)."""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .core.output.metric_keys import BOUNDS, judge_all, noise_of, readings, spec_of, split_bound
from .core.output.reporter import measurement_settings, setting_differences

BENCHMARK_NAME = "maestro"


@dataclass(frozen=True, kw_only=True)
class _LocalABTestMetric:
    """Stand-in for TorchBench's TorchBenchABTestMetric (same fields) outside TorchBench."""

    control: float | str
    treatment: float | str
    delta: float | str


@dataclass(frozen=True, kw_only=True)
class _LocalABTestResult:
    """Stand-in for TorchBench's TorchBenchABTestResult (same fields) outside TorchBench."""

    name: str
    control_env: dict[str, str]
    treatment_env: dict[str, str]
    details: dict[str, Any]
    control_only_metrics: dict[str, float] = field(default_factory=dict)
    treatment_only_metrics: dict[str, float] = field(default_factory=dict)
    bisection: str = "pytorch"
    bisection_mode: str = "bisect"
    bisection_config_file_path: str | None = None


def _result_types() -> tuple[type, type]:
    """TorchBench's result types inside a TorchBench checkout, else the local stand-ins (by
    whether ``userbenchmark.utils`` exists: a utils module that fails to import fails loudly)."""
    top_package = (__package__ or "").split(".")[0]
    utils_name = f"{top_package}.utils"
    if top_package and importlib.util.find_spec(utils_name) is not None:
        utils = importlib.import_module(utils_name)
        return utils.TorchBenchABTestResult, utils.TorchBenchABTestMetric
    return _LocalABTestResult, _LocalABTestMetric


TorchBenchABTestResult, TorchBenchABTestMetric = _result_types()


def run(
    control: Mapping[str, Any],
    treatment: Mapping[str, Any],
    *,
    threshold_overrides: Mapping[str, float] | None = None,
    judge_harness: bool = False,
    force: bool = False,
) -> Any:
    """A TorchBenchABTestResult whose ``details`` are the metrics that regressed (or changed, if
    descriptive) beyond noise and past their floor (``threshold_overrides``: floors by name), the
    harness's only when ``judge_harness``; ValueError when the runs' settings differ or one
    records none (its ``environ`` missing), unless ``force``."""
    control_metrics = _metrics_of(control, "control")
    treatment_metrics = _metrics_of(treatment, "treatment")
    name = _benchmark_name(control, treatment)
    control_env, treatment_env = _env_of(control), _env_of(treatment)
    for side, env in (("control", control_env), ("treatment", treatment_env)):
        if not measurement_settings(env) and not force:
            raise ValueError(
                f"{side} records no settings (no environ), so that it measured what the other "
                "run did cannot be checked; pass force=True to compare anyway"
            )
    differences = [] if force else setting_differences(control_env, treatment_env)
    if differences:
        raise ValueError(
            "control and treatment were measured with different settings, so their numbers "
            "do not compare: " + "; ".join(differences)
        )
    numbers_c, numbers_t = (
        {k: v for k, v in m.items() if _is_finite_number(v)}
        for m in (control_metrics, treatment_metrics)
    )
    details: dict[str, Any] = {}
    for key in sorted(control_metrics.keys() & treatment_metrics.keys()):
        before, after = control_metrics[key], treatment_metrics[key]
        harness = spec_of(split_bound(key.rpartition("/")[2])[0]).harness
        if not (key in numbers_c and key in numbers_t) and before != after and not harness:
            # Not comparable as numbers: report any difference rather than drop it.
            details[key] = TorchBenchABTestMetric(
                control=_plain(before), treatment=_plain(after), delta=f"{before} -> {after}"
            )
    noise = noise_of(control_env, treatment_env, numbers_c.keys() & numbers_t.keys())
    for j in judge_all(
        readings(numbers_c),
        readings(numbers_t),
        floors=threshold_overrides,
        judge_harness=judge_harness,
        noise=noise,
    ):
        if j.verdict in ("regressed", "changed") and j.decides:
            a, b = j.control.value, j.treatment.value
            details[j.key] = TorchBenchABTestMetric(control=a, treatment=b, delta=_delta(a, b))
    return TorchBenchABTestResult(
        name=name,
        control_env=control_env,
        treatment_env=treatment_env,
        details=dict(sorted(details.items())),
        control_only_metrics=_only(control_metrics, treatment_metrics),
        treatment_only_metrics=_only(treatment_metrics, control_metrics),
        bisection="pytorch",
    )


def _only(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _plain(v) for k, v in sorted(mine.items()) if k not in theirs and not k.endswith(BOUNDS)
    }


def _metrics_of(doc: Mapping[str, Any], side: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ValueError(f"{side}: expected a metrics JSON object, got {type(doc).__name__}")
    metrics = doc.get("metrics")
    if not isinstance(metrics, Mapping):
        raise ValueError(f"{side}: expected a 'metrics' object mapping metric keys to numbers")
    return metrics


def _benchmark_name(control: Mapping[str, Any], treatment: Mapping[str, Any]) -> str:
    names = {doc.get("name") for doc in (control, treatment)} - {None}
    if len(names) > 1:
        raise ValueError(f"control and treatment come from different benchmarks: {sorted(names)}")
    return str(names.pop()) if names else BENCHMARK_NAME


def _env_of(doc: Mapping[str, Any]) -> dict[str, str]:
    """A copy of the file's environ; TorchBench's bisector reads ``git_commit_hash`` from it."""
    env = {str(k): str(v) for k, v in (doc.get("environ") or {}).items()}
    if "pytorch_git_version" in env:
        env.setdefault("git_commit_hash", env["pytorch_git_version"])
    return env


def _delta(control: float, treatment: float) -> float | str:
    """Relative change as TorchBench prints it (0.2 = +20%); text when the control is 0."""
    if control == 0:
        return f"{float(control):g} -> {float(treatment):g}"
    return (float(treatment) - float(control)) / abs(float(control))


def _is_finite_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _plain(value: Any) -> Any:
    """Plain Python value (TorchBench dumps the result with yaml.safe_dump)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value if isinstance(value, (str, bool, type(None))) else str(value)

"""Install maestro's dependencies into the running Python environment.

An installed torch is never touched: the requirements go around it, plus the cupti-python of its
CUDA major version; a missing torch is installed (CPU build without an NVIDIA driver), then this
file runs again. A script, also run by TorchBench's ``install.py --userbenchmark maestro``."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import logging
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

# Run as a script from this folder (no package context), so only absolute stdlib imports here.
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"
# Optional at run time (maestro runs without it), installed here so that --plot works too.
PLOT_REQUIREMENT = "matplotlib>=3.6"

# The torch a fresh environment gets: the release maestro's CI tests (.ci/run pins the same).
TESTED_TORCH_VERSION = "2.13.0"
# PyPI's Linux torch wheels are CUDA builds that pull in GBs of CUDA libraries; the CPU build is
# published on PyTorch's own index.
CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"
TORCH_BUILDS = ("cpu", "cuda")
# Marks the second run, after torch was installed: torch missing then is an error, not a loop.
AFTER_TORCH = "--after-torch-install"

log = logging.getLogger("maestro.install")


def cupti_requirement(cuda_version: str | None) -> str | None:
    """The cupti-python requirement matching torch's CUDA major version (``13.0`` ->
    ``cupti-python>=13,<14``); None for a build without CUDA."""
    if not cuda_version:
        return None
    major_text = cuda_version.split(".")[0]
    if not major_text.isdigit():
        raise ValueError(f"cannot read a CUDA major version from {cuda_version!r}")
    major = int(major_text)
    return f"cupti-python>={major},<{major + 1}"


def torch_installed() -> bool:
    """Whether this environment has torch (found without importing it)."""
    return importlib.util.find_spec("torch") is not None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` of the installed torch; RuntimeError when torch is missing."""
    try:  # numpy may not be installed yet (the requirements bring it): torch warns then
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            import torch
    except ImportError as exc:
        raise RuntimeError(
            f"torch is installed but cannot be imported ({type(exc).__name__}: {exc}); repair "
            f"it (python -m pip install --force-reinstall torch=={TESTED_TORCH_VERSION}) and "
            "run this again"
        ) from exc
    return torch.version.cuda


def nvidia_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver: the kernel module's version file or nvidia-smi."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def numpy_constraint() -> str | None:
    """Pin the installed numpy so pip resolves our packages around it instead of replacing it."""
    try:
        return f"numpy=={importlib.metadata.version('numpy')}"
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_commands(build: str, rerun_args: list[str]) -> list[list[str]]:
    """The commands that install torch's ``build``, then run this file again. The CPU wheel alone
    (``--no-deps``) comes from PyTorch's CPU index, its dependencies from pip's own indexes."""
    if build not in TORCH_BUILDS:
        raise ValueError(f"unknown torch build {build!r}; valid builds: {', '.join(TORCH_BUILDS)}")
    pip = [sys.executable, "-m", "pip", "install"]
    torch = f"torch=={TESTED_TORCH_VERSION}"
    rerun = [sys.executable, str(Path(__file__).resolve()), AFTER_TORCH, *rerun_args]
    if build == "cpu":
        return [[*pip, "--no-deps", "--index-url", CPU_INDEX_URL, torch], [*pip, torch], rerun]
    return [[*pip, torch], rerun]


def pip_commands(cuda_version: str | None, numpy_pin: str | None) -> list[list[str]]:
    """The pip invocations for an environment that has torch. The numpy pin is a requirement,
    not a ``-c`` constraints file: pip keeps it all the same, and the printed command is whole."""
    base = [sys.executable, "-m", "pip", "install"]
    if numpy_pin is not None:
        base.append(numpy_pin)
    commands = [[*base, "-r", str(REQUIREMENTS), PLOT_REQUIREMENT]]
    cupti = cupti_requirement(cuda_version)
    if cupti is not None:
        commands.append([*base, cupti])
    return commands


def _plan(args: argparse.Namespace) -> list[list[str]] | None:
    if not torch_installed() and args.after_torch_install:
        log.error(
            "torch was installed, but %s cannot find it: install torch into this Python's "
            "environment, then run this again",
            sys.executable,
        )
        return None
    if not torch_installed():
        build = args.torch_build or ("cuda" if nvidia_driver_present() else "cpu")
        found = "an NVIDIA driver was found" if build == "cuda" else "no NVIDIA driver was found"
        why = "--torch-build" if args.torch_build else found
        where = f"from {CPU_INDEX_URL}" if build == "cpu" else "from PyPI"
        log.info(
            "torch is not installed: installing torch %s, the %s build (%s), %s",
            TESTED_TORCH_VERSION,
            build.upper(),
            why,
            where,
        )
        return torch_commands(build, ["--no-cupti"] if args.no_cupti else [])
    try:
        cuda_version = torch_cuda_version()
    except RuntimeError as exc:
        log.error("%s", exc)
        return None
    if args.no_cupti:
        cuda_version = None
    elif cuda_version is None:
        log.info("torch has no CUDA: skipping cupti-python")
    return pip_commands(cuda_version, numpy_constraint())


def main(argv: list[str] | None = None) -> int:
    """Install; 0 on success, non-zero when anything failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the commands (ready to paste into a shell) instead of running them",
    )
    parser.add_argument(
        "--no-cupti", action="store_true", help="skip cupti-python (maestro then uses CUDA events)"
    )
    parser.add_argument(
        "--torch-build",
        choices=TORCH_BUILDS,
        help="only where torch is missing: the build to install (default: cuda when an NVIDIA "
        "driver is found, else cpu)",
    )
    parser.add_argument(AFTER_TORCH, action="store_true", help=argparse.SUPPRESS)
    args, ignored = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if ignored:
        # TorchBench's installer forwards its own options (models, --continue_on_fail, ...).
        log.info("ignoring options meant for other installers: %s", " ".join(ignored))

    commands = _plan(args)
    if commands is None:
        return 1
    for command in commands:
        if args.dry_run:  # quoted for a POSIX shell: cupti-python>=13,<14 must not redirect
            print(shlex.join(command))
            continue
        log.info("running: %s", shlex.join(command))
        status = subprocess.run(command, check=False).returncode
        if status != 0:
            log.error("failed with exit status %d: %s", status, shlex.join(command))
            if CPU_INDEX_URL in command:
                log.error(
                    "the CPU build of torch comes from %s: where that index cannot be reached, "
                    "install a CPU build of torch from a mirror or wheel you have, then run "
                    "this again",
                    CPU_INDEX_URL,
                )
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())

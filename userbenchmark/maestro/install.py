"""Install maestro's dependencies into the running Python environment.

Run as ``python install.py`` in this folder; TorchBench's ``python install.py --userbenchmark
maestro`` runs this file the same way. Never installs torch; adds cupti-python for CUDA builds.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import shlex
import subprocess
import sys
from pathlib import Path

# Run as a script from this folder (no package context), so only absolute stdlib imports here.
HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"

log = logging.getLogger("maestro.install")


def cupti_requirement(cuda_version: str | None) -> str | None:
    """The cupti-python requirement matching torch's CUDA (``13.0`` -> ``cupti-python>=13,<14``).

    None for a build without CUDA. cupti-python's major version must match the CUDA runtime's.
    """
    if not cuda_version:
        return None
    major_text = cuda_version.split(".")[0]
    if not major_text.isdigit():
        raise ValueError(f"cannot read a CUDA major version from {cuda_version!r}")
    major = int(major_text)
    return f"cupti-python>={major},<{major + 1}"


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` of the installed torch; RuntimeError when torch is missing."""
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(
            "torch is not importable: install the PyTorch build to benchmark first "
            "(maestro never installs torch)"
        ) from exc
    return torch.version.cuda


def numpy_constraint() -> str | None:
    """Pin the installed numpy so pip resolves our packages around it instead of replacing it."""
    try:
        return f"numpy=={importlib.metadata.version('numpy')}"
    except importlib.metadata.PackageNotFoundError:
        return None


def pip_commands(cuda_version: str | None, numpy_pin: str | None) -> list[list[str]]:
    """The pip invocations to run, in order.

    The numpy pin is a requirement on the command line rather than a ``-c`` constraints file:
    it names the numpy already installed, so pip keeps it and resolves the rest around it (what
    a constraint would do), and the printed command needs no file to run again.
    """
    base = [sys.executable, "-m", "pip", "install"]
    if numpy_pin is not None:
        base.append(numpy_pin)
    commands = [[*base, "-r", str(REQUIREMENTS)]]
    cupti = cupti_requirement(cuda_version)
    if cupti is not None:
        commands.append([*base, cupti])
    return commands


def shell_line(command: list[str]) -> str:
    """``command`` quoted for a POSIX shell (``cupti-python>=13,<14`` must not redirect)."""
    return shlex.join(command)


def main(argv: list[str] | None = None) -> int:
    """Install; 0 on success, non-zero when anything failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the pip commands (ready to paste into a shell) instead of running them",
    )
    parser.add_argument(
        "--no-cupti", action="store_true", help="skip cupti-python (maestro then uses CUDA events)"
    )
    args, ignored = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if ignored:
        # TorchBench's installer forwards its own options (models, --continue_on_fail, ...).
        log.info("ignoring options meant for other installers: %s", " ".join(ignored))

    try:
        cuda_version = torch_cuda_version()
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    if args.no_cupti:
        cuda_version = None
    elif cuda_version is None:
        log.info("torch has no CUDA: skipping cupti-python")

    for command in pip_commands(cuda_version, numpy_constraint()):
        if args.dry_run:
            print(shell_line(command))
            continue
        log.info("running: %s", shell_line(command))
        status = subprocess.run(command, check=False).returncode
        if status != 0:
            log.error("pip failed with exit status %d: %s", status, shell_line(command))
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())

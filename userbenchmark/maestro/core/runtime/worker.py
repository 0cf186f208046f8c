"""One rank's process: run the suite, and turn every way that can end into one exit status with
one line saying why (ranks of the local launcher, of torchrun or srun, or the only process)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from ...errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    ConfigError,
    OptionError,
    RunError,
    cause_of,
    interrupted_message,
    say,
    user_error_message,
)
from ..config.options import RunOptions
from ..config.spec import SuiteSpec
from . import interrupts, supervision
from .phases import SinkFactory, run_suite
from .rendezvous import detect_launch

LINGER_S = 1.0
"""How long a rank's exit waits for threads its blocks left running before it ends anyway."""


def run_worker(suite: SuiteSpec, options: RunOptions, sink: SinkFactory | None = None) -> int:
    """Run ``suite`` on this rank (rank 0 reporting to a ``sink``); returns its exit status.
    What ends the run before its own protocol takes over is said here in one line; what blocks
    leave behind cannot hold the exit (children ended, threads given :data:`LINGER_S`)."""
    launch = detect_launch()
    rank, status = launch.rank, EXIT_FAILED
    one_intra_op_thread_unless_chosen(os.environ)
    try:
        with supervision.exits_refused():
            status = run_suite(suite, options, launch, sink)
    except (ConfigError, OptionError) as err:
        if rank == 0:  # every rank found it; one says it
            say(user_error_message(err))
        status = EXIT_USAGE
    except RunError as err:
        say(f"maestro: rank {rank}: {err}")
        supervision.reached_verdict(EXIT_FAILED, err.missing or ())  # the launcher ends them
    except interrupts.PeerExited:
        pass  # another worker ended before the run began: the launcher says which
    except KeyboardInterrupt:
        if rank == 0 and supervision.forwarded():  # else the local launcher knows who and why
            say(interrupted_message(saved=False))
        status = EXIT_INTERRUPTED
    except BaseException as exc:  # torch or the machine, before the run's own protocol
        say(f"maestro: rank {rank}, phase start-up: {cause_of(exc)}")
    supervision.end_children()
    main = threading.main_thread()
    if any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate()):
        # A block's thread would hold the interpreter's exit forever.
        timer = threading.Timer(LINGER_S, supervision.hard_exit, (status, rank))
        timer.daemon = True
        timer.start()
    return status


def one_intra_op_thread_unless_chosen(environ: Mapping[str, str]) -> None:
    """One intra-op thread per rank unless ``OMP_NUM_THREADS`` says otherwise, whoever started
    the rank (``--nproc``, torchrun, srun, or none: the only process of a one-rank run). CPU
    blocks run on lane threads of their own, and an intra-op pool as wide as the host competes
    with them: a one-rank 256³ GEMM on a 2-core host then ran at one of two speeds, set per
    process (244 or 330-400 µs; 308-331 µs with one thread)."""
    if "OMP_NUM_THREADS" not in environ:
        import torch

        torch.set_num_threads(1)

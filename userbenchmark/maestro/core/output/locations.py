"""Where a run writes, checked and claimed before any worker starts, by the process that
outlives the run's writer (the local launcher; under torchrun/srun, rank 0), and atomic writes:
readers see a file's old contents or its new ones, never a part."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import logging
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ...errors import OptionError
from ..config.options import RunOptions

log = logging.getLogger("maestro.output")

_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
# open(path, "w")'s mode, less the umask: mkstemp's 0600 would hide files from dashboards.
_NEW_FILE_MODE = 0o666
_NAME_ATTEMPTS = 100
TEMPORARY_SUFFIX = ".tmp"


def unlink_quietly(path: str | os.PathLike[str]) -> None:
    """Remove ``path``; one already gone (or not removable) is no error."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _create_temporary(path: Path) -> tuple[int, str]:
    for _ in range(_NAME_ATTEMPTS):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")
        with contextlib.suppress(FileExistsError):
            return os.open(tmp, _CREATE_FLAGS, _NEW_FILE_MODE), tmp
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(path.parent))


def _write_temporary(path: Path, data: bytes) -> str:
    """``data`` in a fsynced temporary file next to ``path`` (whose folder must exist: a
    folder removed during a run is never created again); returns the temporary's path."""
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            try:
                st: os.stat_result | None = os.stat(path)
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode):  # a rewritten file keeps its mode
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode) & 0o777)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp


def atomic_write_files(files: Mapping[Path, bytes]) -> None:
    """Write every file so readers see old or new contents, never a part, all together (every
    temporary is complete before the first rename); a failure leaves no temporary behind."""
    written: dict[Path, str] = {}
    try:
        for path, data in files.items():
            written[path] = _write_temporary(path, data)
        for path in list(written):
            os.replace(written[path], path)
            del written[path]  # only once renamed: a failed rename still cleans its temporary
    except BaseException:
        for tmp in written.values():
            unlink_quietly(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part."""
    atomic_write_files({path: data})


# What maestro writes into --output-dir, and its plots: moved aside at start.
MAESTRO_OUTPUT_NAMES: Final = (
    *(f"{s}.{ext}" for s in ("results", "patterns", "pairs", "whatif") for ext in ("json", "csv")),
    "failures.json",
    "run.json",
    "trace.json",  # an earlier version's combined trace: moved aside like the others
    "traces",
    "processes",  # run --repeat's (processes.py)
    *(f"abtest{suffix}" for suffix in (".json", "-a", "-b")),  # abtest.py
)
_PLOT_GLOB: Final = "plot-*.png"
LOCK_NAME: Final = ".maestro.lock"  # removed when the run ends
# Where TorchBench looks for metrics files: <repo>/.userbenchmark/maestro.
DEFAULT_METRICS_DIR: Final = Path(__file__).resolve().parents[4] / ".userbenchmark" / "maestro"
# An atomic write's temporary: .NAME.<8 hex>.tmp (_create_temporary).
_TEMPORARY: Final = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{8}" + re.escape(TEMPORARY_SUFFIX))
PREVIOUS_PREFIX: Final = "previous-"
# TorchBench tooling globs metrics-*.json; the name is metrics-YYYYmmddHHMMSS[-N].json.
METRICS_PREFIX: Final = "metrics-"
_METRICS_NAME: Final = re.compile(re.escape(METRICS_PREFIX) + r"\d{14}(-\d+)?\.json")
_RUN_MARKERS: Final = ("run.json", "results.json", LOCK_NAME)  # a folder a run wrote, or writes
_SPECIAL_ROOTS: Final = ("/proc", "/sys")
_ATTEMPTS: Final = 1000


@dataclass
class PreparedOutputs:
    """One run's checked output locations, held while it writes: the output folder (None without
    ``--output-dir``) and the reserved metrics file name (None: no metrics). ``close()``
    releases the folder's lock and the metrics name."""

    output_dir: Path | None
    metrics_path: Path | None
    _lock_fd: int | None
    _reservation: Path | None

    def close(self) -> None:
        if self._reservation is not None:
            unlink_quietly(self._reservation)
            self._reservation = None
        if self._lock_fd is not None and self.output_dir is not None:
            # The lock file goes while still held, then the lock: a run that opened the file
            # meanwhile finds, once it holds the lock, that the name no longer leads to it.
            lock = self.output_dir / LOCK_NAME
            if _same_file(os.fstat(self._lock_fd), lock, follow=False):
                unlink_quietly(lock)
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __enter__(self) -> PreparedOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepare_output_locations(
    output_dir: str | os.PathLike[str] | None,
    metrics_dir: str | os.PathLike[str] | None,
    *,
    now: _dt.datetime | None = None,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> PreparedOutputs:
    """Check, create and claim the run's output locations (OptionError naming the option,
    path and reason): the output folder locked, an earlier run's files moved aside, a killed
    run's temporaries removed, a metrics name reserved (docs/reliability.md); refused before
    anything moves when one of ``inputs`` (the run's pattern file, custom ops' modules) is among
    the files it would move aside or rewrite."""
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d%H%M%S")
    out = None if output_dir is None else _usable_dir("--output-dir", Path(output_dir))
    metrics = None if metrics_dir is None else _usable_dir("--metrics-dir", Path(metrics_dir))
    for source in inputs if out is not None else ():
        claimed = [out / name for name in MAESTRO_OUTPUT_NAMES] + sorted(out.glob(_PLOT_GLOB))
        hit = next(
            (c for c in claimed if _same_file(os.stat(source), c) or _inside(source, c)), None
        )
        if hit is not None:
            raise OptionError(
                f"--output-dir {out}: {os.fspath(source)} is an input of this run, and {hit.name} "
                "is a name a run moves aside and writes there: copy it elsewhere, or choose "
                "another folder"
            )
    prepared = PreparedOutputs(out, None, None if out is None else _lock(out), None)
    try:
        if out is not None:
            _move_aside(out, stamp)
        if metrics is not None:
            _remove_temporaries(metrics)
            prepared.metrics_path, prepared._reservation = _reserve_metrics_name(metrics, stamp)
    except BaseException:
        prepared.close()
        raise
    return prepared


def check_output_file(
    option: str,
    path: str | os.PathLike[str],
    *,
    suffixes: Sequence[str],
    writes: str,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """``path`` as the file ``option`` names, which a command may write (replacing an earlier
    file atomically, never through a link); OptionError, one line naming the option, the path
    and why, for each refusal docs/reliability.md lists ("Files named on the command line")."""
    text = os.fspath(path)
    if not text:
        raise OptionError(f"{option} '': an empty path; name the file to write")
    target, where = Path(text), f"{option} {text}"
    if _under_special_root(target):
        raise OptionError(f"{where}: is under /proc or /sys (kernel interfaces, not files)")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OptionError(f"{where}: cannot be checked: {_reason(exc)}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OptionError(f"{where}: is a folder; name the file to write")
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OptionError(
            f"{where}: is a symbolic link; maestro never writes through a link: remove it, or "
            "name another file"
        )
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OptionError(f"{where}: is not a regular file (a pipe, a socket or a device)")
    for source in inputs:
        if st is not None and _same_file(st, source):
            raise OptionError(f"{where}: is {os.fspath(source)}, an input of this command")
    named = target.name in MAESTRO_OUTPUT_NAMES or target.match(_PLOT_GLOB)
    in_run_folder = named and any(os.path.lexists(target.parent / m) for m in _RUN_MARKERS)
    if _METRICS_NAME.fullmatch(target.name) or in_run_folder:
        raise OptionError(f"{where}: is a file of a maestro run; name another file")
    if target.suffix.lower() not in suffixes:
        raise OptionError(
            f"{where}: writes {writes}: name a file ending in {' or '.join(suffixes)}"
        )
    return target


def metrics_folder(options: RunOptions) -> Path | None:
    """Where the run's metrics file goes: ``--metrics-dir``, else :data:`DEFAULT_METRICS_DIR`;
    None with ``--no-metrics``."""
    if not options.write_metrics:
        return None
    return Path(options.metrics_dir) if options.metrics_dir else DEFAULT_METRICS_DIR


def _under_special_root(path: Path) -> bool:
    candidates = {os.path.abspath(path), os.path.realpath(path)}
    return any(c == r or c.startswith(r + os.sep) for c in candidates for r in _SPECIAL_ROOTS)


def _usable_dir(option: str, path: Path) -> Path:
    if _under_special_root(path):
        raise OptionError(
            f"{option} {path}: is under /proc or /sys (kernel interfaces, not a place for files)"
        )
    try:  # a name too long (over 255 bytes a component), a NUL byte, no permission
        a_file = path.exists() and not path.is_dir()
        if not a_file:
            path.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        why = _reason(exc) if isinstance(exc, OSError) else exc
        raise OptionError(f"{option} {path}: cannot be created: {why}") from None
    if a_file:
        raise OptionError(f"{option} {path}: is a file, expected a directory")
    try:
        with tempfile.TemporaryFile(dir=path) as probe:  # gone once closed, even after an error
            probe.write(b"probe")
            probe.flush()
    except OSError as exc:
        raise OptionError(f"{option} {path}: is not writable: {_reason(exc)}") from None
    return path


def _same_file(st: os.stat_result, path: str | os.PathLike[str], *, follow: bool = True) -> bool:
    try:
        other = os.stat(path, follow_symlinks=follow)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)


def _inside(path: str | os.PathLike[str], folder: Path) -> bool:
    inner, outer = os.path.realpath(path), os.path.realpath(folder)
    return os.path.isdir(outer) and inner.startswith(outer + os.sep)


def _lock(folder: Path) -> int | None:
    """Hold an exclusive lock on ``folder`` until closed: a regular file, opened without
    following a link (a planted link is refused, its target untouched)."""
    path = folder / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OptionError(_planted(folder, LOCK_NAME)) from None
            raise OptionError(
                f"--output-dir {folder}: cannot create {LOCK_NAME}: {_reason(exc)}"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OptionError(f"--output-dir {folder}: {LOCK_NAME} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise OptionError(
                f"--output-dir: another maestro run is writing to {folder} (pid {holder})"
            ) from None
        except OSError as exc:  # a file system without locks (some NFS or Lustre mounts)
            os.close(fd)
            log.warning(
                "cannot lock %s (%s): another run may write there too", folder, _reason(exc)
            )
            return None
        if _same_file(os.fstat(fd), path, follow=False):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # the run that held it removed the file as it ended: take a new one
    raise OptionError(f"--output-dir {folder}: {LOCK_NAME} keeps changing; is a run starting?")


def _planted(folder: Path, name: str) -> str:
    return (
        f"--output-dir {folder}: {name} is a symbolic link; maestro writes that name itself "
        "and never follows a link there: remove the link, or choose another folder"
    )


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def _remove_temporaries(folder: Path) -> None:
    """Remove the temporaries of maestro's files a killed run left in ``folder`` (a metrics
    file's only when no live run reserved its name), naming them in one log line."""
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_file(follow_symlinks=False))
    except OSError:
        return
    removed = []
    for name in names:
        match = _TEMPORARY.fullmatch(name)
        target = match["name"] if match else ""
        if (
            target in MAESTRO_OUTPUT_NAMES
            or target.startswith("plot-")
            or (target.startswith(METRICS_PREFIX) and not (folder / f".{target}.reserved").exists())
        ):
            unlink_quietly(folder / name)
            removed.append(name)
    if removed:
        log.info("removed temporary files a killed run left in %s: %s", folder, ", ".join(removed))


def _exclusive_dir(parent: Path, base: str) -> Path:
    for n in range(1, _ATTEMPTS + 1):
        candidate = parent / (base if n == 1 else f"{base}-{n}")
        with contextlib.suppress(FileExistsError):
            candidate.mkdir()
            return candidate
    raise OptionError(f"--output-dir {parent}: no free name {base}-N to move earlier files to")


def _move_aside(folder: Path, stamp: str) -> None:
    _remove_temporaries(folder)
    stale = [folder / name for name in MAESTRO_OUTPUT_NAMES if os.path.lexists(folder / name)]
    stale += sorted(p for p in folder.glob(_PLOT_GLOB) if p.is_file() or p.is_symlink())
    for path in stale:
        if path.is_symlink():
            raise OptionError(_planted(folder, path.name))
    if not stale:
        return
    try:
        dest = _exclusive_dir(folder, PREVIOUS_PREFIX + stamp)
        for path in stale:
            os.rename(path, dest / path.name)
    except OSError as exc:
        raise OptionError(
            f"--output-dir {folder}: cannot move the files of an earlier run aside: {_reason(exc)}"
        ) from None
    shown = ", ".join(p.name for p in stale)
    log.info(
        "moved %d file(s) of an earlier run from %s to %s: %s", len(stale), folder, dest, shown
    )


def _reserve_metrics_name(folder: Path, stamp: str) -> tuple[Path, Path]:
    """``folder/metrics-<stamp>[-N].json`` that no file and no other run's reservation holds
    (a hidden file created with O_EXCL, which TorchBench's ``metrics-*.json`` never sees)."""
    for n in range(1, _ATTEMPTS + 1):
        name = f"{METRICS_PREFIX}{stamp}{'' if n == 1 else f'-{n}'}.json"
        reservation = folder / f".{name}.reserved"
        try:
            fd = os.open(reservation, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise OptionError(
                f"--metrics-dir {folder}: cannot reserve a metrics file name: {_reason(exc)}"
            ) from None
        os.close(fd)
        if os.path.lexists(folder / name):  # an earlier run's finished file
            unlink_quietly(reservation)
            continue
        return folder / name, reservation
    raise OptionError(f"--metrics-dir {folder}: no free metrics file name for {stamp}")


def _reason(exc: OSError) -> str:
    return exc.strerror or errno.errorcode.get(exc.errno or 0, "") or str(exc)

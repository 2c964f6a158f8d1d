"""Checks of command-line arguments that fail with one line before anything starts.

Not a command module (the leading underscore keeps `rack.cli` from registering it):
the commands call these helpers. Each failure prints ``error: <message>`` on stderr
and exits with code 2, without a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Optional

import typer


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `message` as a one-line error and exit with `code` (no traceback)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def bad_row_hint(exc: BaseException) -> str:
    """What a command that takes --skip-bad-rows adds to its error when `exc` is about
    one bad trace row that the option would skip and count (a `workloads.TraceError`
    with a skip reason; the reader raises these only without the option), else ""."""
    from workloads import TraceError

    if isinstance(exc, TraceError) and exc.reason is not None:
        return " (use --skip-bad-rows to skip and count such rows)"
    return ""


def check_positive(option: str, value: Optional[float]) -> None:
    """Refuse a numeric option (None: not given) that is not a finite number > 0;
    the message names `option` (e.g. "--dilation")."""
    if value is not None and not (math.isfinite(value) and value > 0):
        fail(f"{option}: expected a finite number > 0, got {value:g}")


def positive_numbers(text: str, option: str) -> list[float]:
    """A comma-separated list of finite numbers > 0 (`--rates 1,2,4`), in the order
    given; fails naming `option` on an empty list, an empty entry (`1,,2`), a word,
    or a number that is not finite and > 0."""
    try:
        vals = [float(x) for x in text.split(",")]      # an empty entry is no number either
    except ValueError:
        fail(f"{option}: expected comma-separated numbers, e.g. 1,2,4, got {text!r}")
    if not all(math.isfinite(v) and v > 0 for v in vals):
        fail(f"{option}: expected finite positive numbers, got {text!r}")
    return vals


def out_path(value) -> Path:
    """Typer `parser` of a path option (`--out`): an empty value is refused (typer would
    read "" as ".", the current folder). Raises typer.BadParameter."""
    if not str(value).strip():
        raise typer.BadParameter("empty; expected a path")
    return Path(value)


def prepare_out_dir(option: str, path: Path) -> Path:
    """Create results folder `path` (and its missing parents) and check that a file can
    be written in it, so that a run never ends in a results folder it cannot write.

    Fails with one line naming `option` and `path` for an empty path, a name longer
    than the file system allows, an existing file (`/dev/null`), a symbolic link loop,
    a path under a file, a folder that cannot be created (`/proc/x`, a read-only file
    system) or written. Returns `path`."""
    from workloads.paths import file_problem, name_problem, shown

    p = Path(path)
    bad = name_problem(p)
    if bad is None and os.path.lexists(p):
        bad = file_problem(p)
        if bad is not None and bad.startswith("is a directory"):
            bad = None
        elif bad is not None and bad.startswith("is "):
            bad = bad.removesuffix(", not a regular file") + " (not a directory)"
        elif bad is None:
            bad = "exists and is not a directory"
    if bad is not None:
        fail(f"{option} {shown(p)}: {bad}; expected a results folder (it is created if missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".rack-write-test-") as probe:
            probe.write(b"ok")
            probe.flush()
    except OSError as exc:
        fail(f"{option} {shown(p)}: cannot write a results folder there "
             f"({exc.strerror or type(exc).__name__}{': ' + shown(exc.filename) if exc.filename else ''})")
    return p


def prepare_out_file(option: str, path: Path, what: str) -> Path:
    """Check, before the work, that file `path` can be written: not a folder (`what`
    names what is expected, e.g. "a JSON file"), its folder created and writable
    (`prepare_out_dir`). Fails with one line naming `option`; returns `path`."""
    if Path(path).is_dir():
        fail(f"{option} {path}: is a directory; expected the path of {what}")
    prepare_out_dir(option, Path(path).parent)
    return path


def report_failure(folder: Path, exc: BaseException, what: str = "run", keep_partial: bool = True) -> NoReturn:
    """One line for a run that failed, its traceback in `folder`/error.log, exit 1.

    A `rack.run.runner.RunAborted` (a component raised, or the rack stalled) gets its
    results measured until then written to `folder` (status "aborted") when
    `keep_partial`; anything else is a stalled Ray run or a bug."""
    from rack.measure.results import write_error_log, write_results
    from rack.run.runner import RunAborted

    log = write_error_log(folder, exc)
    if isinstance(exc, RunAborted):
        if keep_partial:
            write_results(folder, exc.output.results, exc.output.columns)
            fail(f"{what} aborted: {exc}; what was measured is in {folder}/results.json (status aborted), "
                 f"the traceback in {log}", code=1)
        fail(f"{what} aborted: {exc} (traceback in {log})", code=1)
    fail(f"{what} failed: {type(exc).__name__}: {' '.join(str(exc).split())} (traceback in {log})", code=1)


def stops_on_signal(command: Callable) -> Callable:
    """Decorator of a long command whose work has no partial result to keep (`rack
    compare`, `rack study`, `rack bench`): SIGINT/SIGTERM stop it at once through
    `interruptible` (one line, exit code 128 + the signal's number, no traceback), the
    worker processes of its maps terminated (`rack.runtime.parallel`), none left."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        with interruptible():
            return command(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def interruptible() -> Iterator:
    """SIGINT/SIGTERM handlers for a command's work (`rack.runtime.interrupt`): yields
    the StopRequest to hand to `run_scenario(stop=...)`. A signal that stops the
    command at once (outside a replay, or a second one) ends it here with one line and
    exit code 128 + the first signal's number (130 for SIGINT, 143 for SIGTERM), without
    a traceback."""
    from rack.runtime.interrupt import exit_code, handle_signals

    with handle_signals() as stop:
        try:
            yield stop
        except KeyboardInterrupt:
            again = "again " if stop.count > 1 else ""
            typer.echo(f"interrupted {again}({stop.signal_name or 'SIGINT'}): stopped at once, "
                       "no results written", err=True)
            raise typer.Exit(exit_code(stop.signal_name or "SIGINT")) from None

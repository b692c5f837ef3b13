"""The profile as one HTML page: ``mxprof report TRACE... -o report.html``.

The page is self-contained: plotly.js, the styles and every number are in the
file, fonts are the system's, and opening it makes no network request, so it
can be mailed or attached to a ticket and opened offline.  It reads every
trace ``mxprof.load`` reads (mxprof's JSON, gzip and Perfetto files,
torch.profiler's and viztracer's JSON).  Sections, top to bottom: hints,
the comparison with a baseline (``baseline=``), summary, ranges (a sortable
table and the selected range's histogram), steps, counters, memory,
processes side by side (several processes) and how to open the timeline.

Part of the offline tier: it reads files and never loads the live profiler.
It draws with plotly, a core dependency of mxprof: a default install writes
the page (``mxprof run`` does after every run).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import sys
import tempfile
import types
from collections.abc import Iterator, Sequence
from typing import Union

from ..errors import ConfigError, OutputError, TraceFormatError
from ..trace import Trace
from ..trace.engine import Local, parse_engine
from ..trace.model import read_events
from ..trace.processes import job
from ..trace.reader import shown
from ._html import diff_html, hints_html, page
from ._parallel import beside
from ._sections import build
from .diff import Diff
from .diff import diff as compare
from .hints import find_hints, not_checked

__all__ = ["report"]

PathArg = Union[str, "os.PathLike[str]"]
Inputs = Union[PathArg, Sequence[PathArg]]


def _paths(inputs: Inputs, what: str) -> list[str]:
    if isinstance(inputs, (str, os.PathLike)):
        return [os.fspath(inputs)]
    paths = [os.fspath(p) for p in inputs]
    if not paths:
        raise TraceFormatError(f"no {what} trace given")
    return paths


def _load(path: str) -> Trace:
    trace = read_events(path)
    # Stack samples alone (an uninstrumented script under `mxprof run`) make a page.
    if not len(trace) and not len(trace.samples) and not trace.truncated:
        raise TraceFormatError(
            f"{shown(path)}: the trace holds no events and no samples; nothing to report"
        )
    return trace


def _check_output(output: str) -> None:
    """Fail before the work when the page could not be written where asked."""
    where = shown(output)
    folder = os.path.dirname(os.path.abspath(output))
    if os.path.isdir(output):
        raise OutputError(f"cannot write report {where}: it is a directory", output, errno.EISDIR)
    if not os.path.isdir(folder):
        raise OutputError(
            f"cannot write report {where}: no such directory {shown(folder)}", output, errno.ENOENT
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(
            f"cannot write report {where}: no permission to write in {shown(folder)}",
            output,
            errno.EACCES,
        )


def _write(output: str, text: str) -> None:
    """Write the page whole or not at all: a temporary file beside it, then a rename."""
    folder = os.path.dirname(os.path.abspath(output))
    try:
        fd, temp = tempfile.mkstemp(prefix=".mxprof-report-", suffix=".tmp", dir=folder)
    except OSError as e:
        raise OutputError(
            f"cannot write report {shown(output)}: {e.strerror or e}", output, e.errno
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, output)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise OutputError(
            f"cannot write report {shown(output)}: {e.strerror or e}", output, e.errno
        ) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _diff(baseline: list[str], traces: Sequence[Trace]) -> Diff:
    base = [_load(p) for p in baseline]
    return compare(base if len(base) > 1 else base[0], traces if len(traces) > 1 else traces[0])


def report(
    paths: Inputs,
    output: PathArg,
    *,
    baseline: Inputs | None = None,
    jobs: int | None = None,
    engine: str = "local",
) -> str:
    """Write the HTML report of one or more traces; return the path written.

    Several inputs (the files of one distributed job, or one file per process)
    go on one time axis by their wall-clock starts, as ``mxprof merge`` puts
    them, and the page compares their processes side by side.

    Args:
        paths: a trace file, or several.
        output: the page to write (replaced whole: it is written to a
            temporary file in the same directory, then renamed).
        baseline: trace file(s) of an earlier run; the page then starts with
            the per-name comparison of ``mxprof.report.diff``.
        jobs: the processes the page is built with: 1, all of it here,
            one part after the other; 2 or more, or None (the cores), the
            hints are found in a forked child while this process builds the
            sections (``_parallel.beside``; where forking is safe).  The
            inputs are always read here: the page needs every event in this
            process, and reading them in workers and sending the traces
            back was measured slower (8 files of 1 M events on 2 cores:
            58.4 s against 54.4 s; docs/scaling.md).  The page is the same
            byte for byte whatever ``jobs`` says.
        engine: "local" only.  A Dask engine is refused with the reason
            (the same as above: the page is built from every event here);
            ``stats``, ``ranks``, ``merge --window``, ``export`` and ``sql``
            run on one.

    Returns:
        ``output`` as a string.

    Raises:
        TraceReadError: an input cannot be read (missing, no permission).
        TraceFormatError: an input is not a trace, or holds no events and no samples.
        ConfigError: a bad ``jobs``, or an ``engine`` that is not "local".
        OutputError: the page cannot be written there (no such directory, no
            permission, a directory); nothing is left behind.

    Example:
        >>> import mxprof.report
        >>> mxprof.report.report("trace.json", "report.html")  # doctest: +SKIP
        'report.html'
    """
    Local(jobs)  # checked as every command with --jobs checks it
    if parse_engine(engine) is not None:
        raise ConfigError(
            f"engine {engine!r}: the page is built from every event of the inputs "
            "in this process, so they are read here (--jobs sets its processes); "
            "stats, ranks, merge --window, export and sql run on a Dask engine"
        )
    inputs = _paths(paths, "input")
    bases = _paths(baseline, "baseline") if baseline is not None else []
    out = os.fspath(output)
    _check_output(out)
    with _collector_paused():
        traces = [_load(p) for p in inputs]
        # The model of the job's processes and the statistics of every
        # thread's ranges (one walk; durations sorted in place), once, before
        # the fork: the hints (in the child) and the sections (here) both
        # read them.
        job(traces)
        for trace in traces:
            trace.key_averages()
        # The hints need no nesting (self times): the sections work it out beside them.
        hints, sections = beside(
            lambda: find_hints(traces), lambda: build(inputs, traces), fork=jobs != 1
        )
        compared = diff_html(_diff(bases, traces), bases) if bases else ""
        text = page(sections, hints_html(hints, not_checked(traces)), compared)
    _write(out, text)
    return out


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a report is built: its millions of
    events would be scanned again and again, and it makes little garbage."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Package(types.ModuleType):
    """``mxprof.report(paths, output)`` is :func:`report`: the package is
    callable, so that its submodules (``mxprof.report.diff``, ``.hints``)
    stay reachable as attributes while the name reads as the function."""

    def __call__(
        self,
        paths: Inputs,
        output: PathArg,
        *,
        baseline: Inputs | None = None,
        jobs: int | None = None,
        engine: str = "local",
    ) -> str:
        return report(paths, output, baseline=baseline, jobs=jobs, engine=engine)


sys.modules[__name__].__class__ = _Package

"""A trace's stack samples in other tools' formats: ``mxprof export``.

``FORMATS`` names what :func:`export` writes; :func:`render` turns a loaded
:class:`~mxprof.trace.Trace` into the text of each:

- ``speedscope`` (:func:`to_speedscope`): speedscope's JSON file format
  (https://www.speedscope.app/file-format-schema.json), one ``sampled``
  profile per thread, its samples in time order.  A sample weighs one sample
  period (1 / ``sample_rate``) in seconds when the trace's configuration says
  the rate (``otherData.config``), else 1 with unit ``none`` (Perfetto and
  merged files).
- ``collapsed`` (:func:`to_collapsed`): Brendan Gregg's folded stacks, as
  ``flamegraph.pl``, speedscope, inferno and most flame graph tools read
  them: one line per distinct stack, ``frame;frame;...;frame COUNT``,
  outermost first.  Threads are not prefixed by default, so that the same
  code on several threads (a worker pool) folds into one tower, as in the
  report's flame graph of the whole program; ``threads=True`` (``mxprof
  export --threads``) puts one root frame per thread,
  ``<thread name> (pid P tid T)``, as py-spy's raw format does.

Frames are named ``function (file:line)``, the file as recorded (its whole
path), ``function`` alone when the frame has no file (``<waiting>``, which
stays the leaf under the function that blocks).  Every sample is exported,
whatever range it was taken in: ranges are not frames.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import Counter
from typing import Any, Union

from .._version import __version__
from ..errors import OutputError, ProfilerError
from .model import Trace, load
from .reader import PathArg, shown
from .samples import Frame, Sample, settings

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"

Source = Union[PathArg, Trace]


class ExportError(ProfilerError, ValueError):
    """Nothing to export: the trace holds no stack samples.  The message names
    the file and how to record samples.

    Example:
        >>> try:
        ...     to_collapsed(Trace([]))
        ... except ExportError as e:
        ...     print(str(e).split(" (")[0])
        <Trace>: no stack samples to export
    """


def to_speedscope(trace: Trace) -> dict[str, Any]:
    """The trace's samples as a speedscope file (a JSON document).

    Raises:
        ExportError: the trace has no samples.

    Example:
        >>> doc = to_speedscope(mxprof.load("trace.json"))  # doctest: +SKIP
        >>> [(p["name"], len(p["samples"]), p["unit"]) for p in doc["profiles"]]  # doctest: +SKIP
        [('MainThread (pid 4242 tid 1)', 812, 'seconds')]
    """
    threads = _threads(trace)
    rate = settings(trace.metadata)["Rate"]
    unit, weight = ("seconds", 1.0 / rate) if rate else ("none", 1)
    frames: list[dict[str, Any]] = []
    index: dict[Frame, int] = {}

    def frame_index(frame: Frame) -> int:
        got = index.get(frame)
        if got is None:
            got = index[frame] = len(frames)
            entry: dict[str, Any] = {"name": frame[0]}
            if frame[1]:
                entry["file"] = frame[1]
            if frame[2]:
                entry["line"] = frame[2]
            frames.append(entry)
        return got

    profiles: list[dict[str, Any]] = []
    counts: list[int] = []
    for (pid, tid), samples in threads.items():
        counts.append(len(samples))
        profiles.append(
            {
                "type": "sampled",
                "name": _thread_name(trace, pid, tid),
                "unit": unit,
                "startValue": 0,
                "endValue": len(samples) * weight,
                "samples": [[frame_index(f) for f in s.stack] for s in samples],
                "weights": [weight] * len(samples),
            }
        )
    busiest = counts.index(max(counts))
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": os.path.basename(trace.path) if trace.path else "mxprof samples",
        "activeProfileIndex": busiest,  # the thread with the most samples opens first
        "exporter": f"mxprof {__version__}",
    }


def to_collapsed(trace: Trace, *, threads: bool = False) -> str:
    """The trace's samples as folded stacks: ``frame;...;frame COUNT`` lines,
    outermost frame first, sorted; the counts add up to the samples.

    Args:
        trace: a loaded trace.
        threads: start each stack with a frame naming its thread
            (``<thread name> (pid P tid T)``), so that threads stay apart.

    Raises:
        ExportError: the trace has no samples.

    Example:
        >>> print(to_collapsed(mxprof.load("trace.json")), end="")  # doctest: +SKIP
        <module> (/app/train.py:1);step (/app/train.py:10) 640
        <module> (/app/train.py:1);step (/app/train.py:10);<waiting> 172
    """
    counts: Counter[str] = Counter()
    for (pid, tid), samples in _threads(trace).items():
        root = [_folded(_thread_name(trace, pid, tid))] if threads else []
        for sample in samples:
            names = root + [_folded(_frame_name(f)) for f in sample.stack]
            counts[";".join(names or ["<no frames>"])] += 1
    return "".join(f"{stack} {n}\n" for stack, n in sorted(counts.items()))


# What export writes (a later binary format writes its file its own way).
FORMATS = ("speedscope", "collapsed")


def render(trace: Trace, format: str, *, threads: bool = False) -> str:
    """The text of a file of one of ``FORMATS`` (threads: collapsed only).

    Raises:
        ValueError: format is not one of ``FORMATS``.
        ExportError: the trace has no samples.

    Example:
        >>> render(mxprof.load("trace.json"), "collapsed").count("\\n")  # doctest: +SKIP
        14
    """
    if format == "speedscope":
        return json.dumps(to_speedscope(trace), ensure_ascii=False) + "\n"
    if format == "collapsed":
        return to_collapsed(trace, threads=threads)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")


def export(source: Source, output: PathArg, format: str, *, threads: bool = False) -> str:
    """Write a trace's stack samples to output in one of ``FORMATS``; return output.

    The file is written whole or not at all (a temporary file beside it, then
    a rename).

    Args:
        source: a trace file (anything ``mxprof.load`` reads) or a loaded Trace.
        output: the file to write.
        format: ``"speedscope"`` or ``"collapsed"``.
        threads: collapsed only: a root frame per thread (see :func:`to_collapsed`).

    Raises:
        ValueError: format is not one of ``FORMATS``.
        TraceReadError, TraceFormatError: the source cannot be read.
        ExportError: the trace holds no stack samples.
        OutputError: output cannot be written.

    Example:
        >>> export("trace.json", "trace.speedscope.json", "speedscope")  # doctest: +SKIP
        'trace.speedscope.json'
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {format!r}")
    trace = source if isinstance(source, Trace) else load(source)
    out = os.fspath(output)
    _write(out, render(trace, format, threads=threads))
    return out


def _threads(trace: Trace) -> dict[tuple[Any, Any], list[Sample]]:
    """The samples per (pid, tid), threads in (pid, tid) order, each in time order."""
    if not trace.samples:
        where = shown(trace.path) if trace.path else "<Trace>"
        raise ExportError(
            f"{where}: no stack samples to export (record them with "
            "set_config(sample_rate=HZ) or mxprof run --sample HZ)"
        )
    found: dict[tuple[Any, Any], list[Sample]] = {}
    for sample in trace.samples.samples:
        found.setdefault((sample.pid, sample.tid), []).append(sample)
    ordered = sorted(found, key=lambda k: (str(k[0]), str(k[1])))
    return {k: sorted(found[k], key=lambda s: s.ts) for k in ordered}


def _thread_name(trace: Trace, pid: Any, tid: Any) -> str:
    name = trace.thread_names.get((pid, tid)) or f"thread {tid}"
    return f"{name} (pid {pid} tid {tid})"


def _frame_name(frame: Frame) -> str:
    function, file, line = frame
    return f"{function} ({file}:{line})" if file else function


def _folded(name: str) -> str:
    """A frame name as one folded-stacks frame: the format has no escapes, so
    ';' (its frame separator) becomes ':' and line breaks become spaces."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


def _write(output: str, text: str) -> None:
    """Write text to output whole or not at all (a temporary file beside it, then a rename)."""
    folder = os.path.dirname(os.path.abspath(output))
    temp = None
    try:
        if os.path.isdir(output):
            raise IsADirectoryError(21, "it is a directory")
        fd, temp = tempfile.mkstemp(prefix=".mxprof-export-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, output)
    except OSError as e:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        raise OutputError(
            f"cannot write {shown(output)}: {e.strerror or e}", output, e.errno
        ) from None

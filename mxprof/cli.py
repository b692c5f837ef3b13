"""The ``mxprof`` command: run, stats, merge, repair, diff, report, ranks, hints, export, sql,
view, ctl.

Each subcommand is one small function taking the parsed arguments and
returning an exit status.  Profiler output goes to stderr, so a profiled
script's own stdout stays as it was.

Only ``run`` loads the live profiler (the compiled core and the session with
its exit, fork and signal hooks); ``stats``, ``merge``, ``repair``,
``diff``, ``ranks``, ``hints``, ``export``, ``sql`` and ``view`` read files with the offline tier
(``mxprof.trace``, ``mxprof.report``) alone.

Exit status, for every command (``main`` decides it in one place): 0
success; 1 a finding the user asked to fail on (``diff
--fail-on-regression``; ``run`` passes on its script's own status); 2 bad
input or usage (a file missing, empty, cut short, damaged or not a trace, an
output that cannot be written, a bad argument).  A reader that stops reading
(``mxprof stats --format json | head -1``) is not an error: the rest of the
output is dropped quietly and the status stays the command's.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO, cast

from . import _ctlclient
from ._render import ROW_SORT_KEYS
from ._version import __version__
from .averages import KeyAverages
from .errors import ConfigError, ProfilerError, TraceFormatError
from .report import report
from .report.diff import MIN_CHANGE_NS, DiffError, diff
from .report.hints import find_hints, not_checked
from .report.hints import to_json as hints_json
from .report.ranks import analyze, rank_part
from .report.ranks import reduce as reduce_ranks
from .report.sql import SqlError
from .trace import Trace, dataloader, engine, export, load, manifest, samples
from .trace.gpu import gpu_json, gpu_rows, gpu_table
from .trace.leak import PROCESS_MEMORY, render_memory
from .trace.leak import summary as memory_summary
from .trace.merge import merge, parse_ranks, parse_window
from .trace.parquet import MissingExtra
from .trace.processes import job
from .trace.repair import repair


class CommandError(Exception):
    """Bad input or usage that a command found itself (``main``: status 2)."""


def cmd_run(args: argparse.Namespace) -> int:
    """Profile a script: state 'run' around it, then write the trace and its
    HTML report (unless --no-report) and print the table."""
    # The one place the command loads the live tier: the other commands must
    # not start a session in a process that only reads files.
    from . import _ctlserver, _sampler, control
    from ._session import SESSION
    from .schedule import current_averages

    script = args.script
    if not os.path.isfile(script):
        raise CommandError(f"no such script: {script!r}")
    _ctlserver.start()  # the script can be looked into (mxprof ctl)
    control.set_config(
        filename=args.output,
        aggregate_stats=args.stats,
        dump_period=args.period,
        follow_children=args.follow_children,
        sample_rate=args.sample,
        sample_mode=args.sample_mode,
    )
    # This command and runpy are the launcher, not the program: samples begin
    # at the script's own frames.  No range of its own either: the whole run
    # is the trace's span, and a range around it would only repeat it.
    _sampler.cut(getattr(runpy, "_run_code", runpy.run_path).__code__)
    sys.argv = [script, *args.args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code: Any = 0
    control.set_state("run")
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:  # the script's own failure: report it, keep its status
        traceback.print_exc()
        code = 1
    finally:
        control.set_state("stop")
        try:
            control.dump()
        except ProfilerError as e:
            print(f"mxprof run: {e}", file=sys.stderr)
        recorded = _report_files(SESSION.trace_paths)
        if args.report and recorded:
            _write_report(recorded)
        if args.stats:
            _print_table(current_averages().without_own(), args.sort, args.top)
            _print_samples(args.top)
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def _print_samples(top: int | None) -> None:
    """The top functions by samples, of the program and of each range."""
    from .stats import render_samples_table, sample_summary  # the live tier (see cmd_run)

    summary = sample_summary()
    if summary is not None and summary["Count"]:
        lines = render_samples_table(summary, top if top is not None else 10)
        print("\n".join(lines), file=sys.stderr)


def _sample_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of samples per second: {text!r}") from None
    if not 0 <= value <= 20_000:
        raise argparse.ArgumentTypeError(f"must be from 0 (off) to 20000 Hz, got {text}")
    return value


def _report_files(paths: Sequence[str]) -> list[str]:
    """Name the trace files this run wrote, and return those the report is of.

    The script may have chosen its own filename (several times), and
    dump(finished=True) while running continues in <stem>-1<ext>, so -o is
    not necessarily where the events went: the -o file, completed when the
    script switched to its own before recording any range, holds none (at
    most the stack samples taken before the switch), and the report is made
    of the files with ranges.  Where no file has any (a script nobody
    instrumented), it is made of the files with stack samples.
    """
    written = [p for p in paths if os.path.isfile(p)]
    held = {p: _holds(p) for p in written}
    recorded = [p for p in written if held[p][0]] or [p for p in written if held[p][1]]
    for path in written:
        left = "" if path in recorded else " (no ranges: not in the report)"
        print(f"mxprof: trace written to {path}{left}", file=sys.stderr)
    if not written:
        print("mxprof: no trace file written", file=sys.stderr)
    return recorded


def _holds(path: str) -> tuple[bool, bool]:
    """Whether a trace file of this run holds events, and stack samples (a
    file that cannot be read counts as holding events: the report then says
    what is wrong)."""
    try:
        trace = load(path)
        return len(trace) > 0, len(trace.samples) > 0
    except TraceFormatError:
        return True, False


# What report_path strips from a trace's name: the suffixes mxprof writes.
_TRACE_SUFFIXES = (".json.gz", ".json", ".pftrace", ".perfetto-trace", ".gz")


def report_path(trace: str) -> str:
    """Where ``mxprof run`` writes the report of a trace: beside it, its name's
    trace suffix replaced by ``.report.html``.

    Example:
        >>> report_path("runs/profile.json"), report_path("t.json.gz"), report_path("t.pftrace")
        ('runs/profile.report.html', 't.report.html', 't.report.html')
    """
    stem = next((trace[: -len(s)] for s in _TRACE_SUFFIXES if trace.endswith(s)), trace)
    return f"{stem}.report.html"


def _write_report(traces: list[str]) -> None:
    """The HTML report of every trace file the run wrote events to, named
    after the first (the -o file, unless the script chose its own).  A
    failure is printed and changes nothing else: the script's exit status
    stays its own."""
    output = report_path(traces[0])
    try:
        written = report(traces, output)
    except Exception as e:  # the report is extra: never let it change the run's outcome
        print(f"mxprof run: report not written: {type(e).__name__}: {e}", file=sys.stderr)
        return
    print(f"mxprof: report written to {written}", file=sys.stderr)


def _print_table(rows: KeyAverages, sort_by: str, top: int | None) -> None:
    """The run's statistics, top rows first; a note instead when the script
    turned statistics off (aggregate_stats=False) or recorded no range."""
    if not rows:
        print(
            "mxprof: no statistics to show (no range was recorded with aggregate_stats on)",
            file=sys.stderr,
        )
        return
    shown = "" if top is None or top >= len(rows) else f" (top {top} of {len(rows)} by {sort_by})"
    print(f"mxprof: statistics{shown}", file=sys.stderr)
    print(rows.table(sort_by=sort_by, row_limit=top), end="", file=sys.stderr)


def _inputs(paths: Sequence[str], command: str) -> list[str]:
    """The traces a command reads: a job's manifest (``distributed.collect(...,
    shared=True)``) stands for its files, each of which must still be there
    and whole (else exit 2 naming them); the processes it lists as missing
    from the job are named on stderr."""
    listed = manifest.expand(list(paths), None, every=True)
    for gap in listed.missing:
        print(f"mxprof {command}: missing {gap.get('process')}: {gap.get('why')}", file=sys.stderr)
    return listed.paths


def cmd_stats(args: argparse.Namespace) -> int:
    """Print per-name statistics of any loadable trace, and the top functions of
    its stack samples when it has any; the profiler's own ranges are left out.
    Several traces: their ranges' statistics together, a file per task on the
    executor ``--jobs``/``--engine`` name."""
    args.traces = _inputs(args.traces, "stats")
    if len(args.traces) > 1:
        return _stats_of_many(args)
    args.trace = args.traces[0]
    trace = load(args.trace)
    if trace.truncated:
        print(
            f"mxprof stats: {args.trace} was cut short; statistics of the "
            f"{len(trace)} events before the cut",
            file=sys.stderr,
        )
    rows = trace.key_averages().without_own()
    gpu = gpu_rows(trace)  # GPU work by launching range (imported NVIDIA databases)
    sampled = _samples_block(trace, args.top)
    # Each reads the events (the process model): only where the trace holds what it shows.
    memory = memory_summary(trace) if PROCESS_MEMORY in trace.point_categories() else None
    loading = dataloader.loader(job([trace])) if dataloader.DOMAIN in trace.categories() else None
    if args.format == "table":
        print(rows.table(sort_by=args.sort, row_limit=args.top), end="")
        if loading is not None:
            print("\n" + "\n".join(dataloader.render(loading, args.top or 20)))
        if gpu:
            print("\n" + gpu_table(gpu, row_limit=args.top), end="")
        if sampled is not None:
            top = args.top if args.top is not None else samples.TABLE_TOP
            print("\n" + "\n".join(samples.render_table(sampled, top)), end="")
        if memory is not None:
            print("\n" + "\n".join(render_memory(memory)))
        return 0
    fields = ("count", "total", "self", "avg", "min", "max", "p50", "p90", "p99")
    top = rows.sorted(args.sort)[: args.top] if args.top is not None else rows.sorted(args.sort)
    doc = {
        "file": args.trace,
        "unit": "ns",
        "truncated": trace.truncated,
        "rows": [
            {"name": r.name, "category": r.category, **{f: getattr(r, f) for f in fields}}
            for r in top
        ],
    }
    if gpu:
        doc["GPU"] = gpu_json(gpu[: args.top] if args.top is not None else gpu)
    if sampled is not None:
        doc["Samples"] = sampled
    if memory is not None:
        doc["Memory"] = memory
    if loading is not None:
        doc["DataLoader"] = dataloader.to_dict(loading)
    print(json.dumps(doc, indent=2, ensure_ascii=False))
    return 0


def _stats_of_many(args: argparse.Namespace) -> int:
    """``stats`` of several traces: map per file, reduce (``trace.engine``)."""
    with engine.executor(args.jobs, args.engine) as ex:
        all_rows, parts = engine.key_averages(args.traces, ex)
    rows = all_rows.without_own()
    for part in parts:
        if part.truncated:
            print(
                f"mxprof stats: {part.path} was cut short; statistics of the "
                f"{part.events} events before the cut",
                file=sys.stderr,
            )
    if args.format == "table":
        print(rows.table(sort_by=args.sort, row_limit=args.top), end="")
        return 0
    fields = ("count", "total", "self", "avg", "min", "max", "p50", "p90", "p99")
    top = rows.sorted(args.sort)[: args.top] if args.top is not None else rows.sorted(args.sort)
    doc = {
        "files": list(args.traces),
        "unit": "ns",
        "truncated": [p.path for p in parts if p.truncated],
        "rows": [
            {"name": r.name, "category": r.category, **{f: getattr(r, f) for f in fields}}
            for r in top
        ],
    }
    print(json.dumps(doc, indent=2, ensure_ascii=False))
    return 0


def _samples_block(trace: Trace, top: int | None) -> dict[str, Any] | None:
    """The ``Samples`` block ``dumps()`` would have shown for the run (its
    ``Rate``, and ``Mode`` when the file says), or None when the trace has no
    samples and says sampling was off."""
    how = samples.settings(trace.metadata)
    if not trace.samples and how["Rate"] is None:
        return None
    return {**trace.samples.summary(top if top is not None else samples.TOP), **how}


def cmd_merge(args: argparse.Namespace) -> int:
    """Merge traces onto one timeline by their baseTimeNanoseconds."""
    for path in args.traces:
        if not os.path.isfile(path):
            raise CommandError(f"no such file: {path!r}")
    try:
        window = parse_window(args.window) if args.window is not None else None
        ranks = parse_ranks(args.ranks) if args.ranks is not None else None
    except ValueError as e:
        raise CommandError(str(e)) from None
    if window is None:
        summary = merge(args.traces, args.output, ranks=ranks)
    else:  # a window's per-input work on the executor (trace.engine)
        with engine.executor(args.jobs, args.engine) as ex:
            summary = merge(args.traces, args.output, window=window, ranks=ranks, executor=ex)
    for item in summary["inputs"]:
        cut = " (cut short)" if item["truncated"] else ""
        print(
            f"mxprof merge: {item['path']}: shifted {item['shift_us']:+.3f} us{cut}",
            file=sys.stderr,
        )
    for gap in summary.get("missing", ()):
        print(f"mxprof merge: missing {gap.get('process')}: {gap.get('why')}", file=sys.stderr)
    print(f"mxprof merge: {summary['events']} events written to {args.output}", file=sys.stderr)
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    """Rewrite a trace cut short or damaged as a valid one (in place, or to -o)."""
    if not os.path.isfile(args.trace):
        raise CommandError(f"no such file: {args.trace!r}")
    result = repair(args.trace, args.output)
    target = args.output or args.trace
    if result["truncated"]:
        print(
            f"mxprof repair: {args.trace}: {result['problem']}; the {result['events']} "
            f"complete events before it written to {target}",
            file=sys.stderr,
        )
    else:
        print(f"mxprof repair: {args.trace} was complete; written to {target}", file=sys.stderr)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    """Compare two profiles; 1 with --fail-on-regression when a regression is
    flagged (a range slower: function shares are relative, so they are shown
    and flagged but never fail), 2 when they cannot be compared (1 would read
    as a regression)."""
    if args.new_runs is None:
        if len(args.traces) != 2:
            raise CommandError(
                f"give BASE NEW, or BASE... -- NEW... ({len(args.traces)} traces and no --)"
            )
        base, new = args.traces[:1], args.traces[1:]
    elif not args.new_runs:
        raise CommandError("no trace after --: give BASE... -- NEW...")
    else:
        base, new = args.traces, args.new_runs
    result = diff(base, new, threshold=args.threshold, min_change=args.min_change)
    for side, paths in (("base", result.base), ("new", result.new)):
        if result.truncated[side]:
            print(
                f"mxprof diff: {' + '.join(paths)} was cut short; "
                "compared the events before the cut",
                file=sys.stderr,
            )
    if args.format == "json":
        print(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        print(result.to_table(), end="")
    if args.fail_on_regression and result.regressions:
        names = ", ".join(r.name for r in result.regressions)
        print(f"mxprof diff: {len(result.regressions)} regression(s): {names}", file=sys.stderr)
        return 1
    return 0


def cmd_ranks(args: argparse.Namespace) -> int:
    """Cross-rank analysis of one merged trace or one trace per rank."""
    args.traces = _inputs(args.traces, "ranks")
    if len(args.traces) == 1:  # one file: read here, its DataLoader too
        result = analyze([load(args.traces[0])])
    else:  # a file a task; the parts carry no DataLoader (its ranges stay in the workers)
        with engine.executor(args.jobs, args.engine) as ex:
            result = reduce_ranks(ex.map(rank_part, args.traces))
    print(result.to_json() if args.format == "json" else result.table(args.top, args.steps))
    return 0


def cmd_hints(args: argparse.Namespace) -> int:
    """The report's hints of traces, as text or JSON."""
    traces = [load(path) for path in args.traces]
    found = find_hints(traces)
    if args.format == "json":
        print(hints_json(found))
        return 0
    if not found:
        print("No hints: none of the rules found anything to point out.")
    for h in found:
        print(f"[{h.severity}] {h.title}  ({h.rule})")
        print("".join(f"    {line}\n" for line in h.evidence) + f"  Try: {h.suggestion}\n")
    missing = not_checked(traces)
    if missing:
        print("Not checked:" + "".join(f"\n  {m}" for m in missing))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a trace's stack samples in another tool's format (-o -: to stdout),
    or traces' events as Parquet tables (-o DIR); a trace without samples is
    bad input (status 2) like any failure."""
    if args.threads and args.format != "collapsed":
        raise CommandError("--threads is for --format collapsed")
    args.traces = _inputs(args.traces, "export")
    if args.format == "parquet":
        if args.window is not None:
            raise CommandError(
                "--window is for speedscope and collapsed; for parquet, cut the window "
                "with merge --window first and export that"
            )
        return _export_parquet(args)
    if len(args.traces) != 1:
        raise CommandError(f"--format {args.format} exports one trace; got {len(args.traces)}")
    args.trace = args.traces[0]
    if args.window is None:
        trace = load(args.trace)
    else:  # only the blocks that may hold the window are read (trace/window.py)
        try:
            kind, lo, hi = parse_window(args.window)
        except ValueError as e:
            raise CommandError(str(e)) from None
        if kind != "seconds":
            raise CommandError("export --window takes START:END in seconds, not steps")
        trace = load(args.trace, window=(lo * 1e9, hi * 1e9))
    if args.output == "-":
        sys.stdout.write(export.render(trace, args.format, threads=args.threads))
    else:
        export.export(trace, args.output, args.format, threads=args.threads)
    cut = " (cut short: the samples before the cut)" if trace.truncated else ""
    within = f" in the window {args.window}" if args.window is not None else ""
    threads = len({(s.pid, s.tid) for s in trace.samples.samples})
    where = "stdout" if args.output == "-" else args.output
    print(
        f"mxprof export: {len(trace.samples)} samples of {threads} thread(s) from "
        f"{args.trace}{cut}{within} written to {where} ({args.format})",
        file=sys.stderr,
    )
    return 0


def _export_parquet(args: argparse.Namespace) -> int:
    from .trace.parquet import write_parquet

    if args.output == "-":
        raise CommandError("--format parquet writes a folder: -o DIR")
    manifest = write_parquet(args.traces, args.output, jobs=args.jobs, engine=args.engine)
    counts = ", ".join(f"{n} {t}" for t, n in manifest["tables"].items())
    print(f"mxprof export: {counts} written to {args.output} (parquet)", file=sys.stderr)
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    """One SQL query over traces or Parquet folders (mxprof.report.sql)."""
    from .report import sql

    table = sql.run(args.query, _inputs(args.inputs, "sql"), jobs=args.jobs, engine=args.engine)
    sql.write(table, args.format, sys.stdout)
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    """Serve a trace (a window of it) to the Perfetto UI (mxprof.report.view)."""
    from .report import view

    return view.run(args)


def cmd_ctl(args: argparse.Namespace) -> int:
    """Look into a running process that uses mxprof (mxprof._ctlclient)."""
    return _ctlclient.run(args)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


# Longer suffixes first: "ms" before "s".
_TIME_UNITS = (("ns", 1), ("us", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000))


def _duration_ns(text: str) -> float:
    """A time as ns: a number with a unit (ns, us, ms, s), or a bare number of ns."""
    for unit, scale in _TIME_UNITS:
        if text.endswith(unit):
            return _percent(text[: -len(unit)]) * scale
    return _percent(text)


def _percent(text: str) -> float:
    value = _number(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {text!r}")
    return value


def cmd_report(args: argparse.Namespace) -> int:
    """Write the HTML report of traces (by default beside the first argument:
    ``report_path``); a job's manifest stands for its files; ``--jobs`` sets the
    page's processes, the inputs are read here (``mxprof.report.report``)."""
    output = args.output if args.output is not None else report_path(args.traces[0])
    traces = _inputs(args.traces, "report")
    baseline = _inputs(args.baseline, "report") if args.baseline else None
    written = report(traces, output, baseline=baseline, jobs=args.jobs, engine=args.engine)
    print(f"mxprof report: written to {written}", file=sys.stderr)
    return 0


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _jobs(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def _engine(text: str) -> str:
    try:
        engine.parse_engine(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _executor_options(p: argparse.ArgumentParser) -> None:
    """--jobs and --engine: where the per-file work of several inputs runs."""
    p.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help=f"files read at once: local processes, or the workers of --engine dask "
        f"(default: the cores, {engine.default_jobs()})",
    )
    p.add_argument(
        "--engine",
        type=_engine,
        default="local",
        metavar="ENGINE",
        help="local (processes), dask (a LocalCluster of --jobs workers) or dask://HOST:PORT "
        f"(a running scheduler; {engine.DASK_EXTRA})",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mxprof", description="mxprof: profile, read and merge traces")
    p.add_argument("--version", action="version", version=f"mxprof {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="profile a Python script")
    run.add_argument("-o", "--output", default="profile.json", help="trace file (profile.json)")
    run.add_argument(
        "--no-stats",
        dest="stats",
        action="store_false",
        help="keep no statistics and print no table at the end",
    )
    # Statistics are on by default now; --aggregate stays accepted for old command lines.
    run.add_argument("--aggregate", dest="stats", action="store_true", help=argparse.SUPPRESS)
    run.add_argument(
        "--sort", default="total", choices=sorted(ROW_SORT_KEYS), help="table order (total)"
    )
    run.add_argument(
        "--top", type=_count, default=15, help="rows of the table (15; 0 for the header only)"
    )
    run.add_argument(
        "--period", type=_positive_float, default=1.0, help="seconds between background writes"
    )
    run.add_argument(
        "--sample",
        type=_sample_rate,
        default=1000.0,
        metavar="HZ",
        help="sample Python stacks HZ times a second (1000; 0 or --no-sample: off)",
    )
    run.add_argument("--no-sample", dest="sample", action="store_const", const=0.0)
    run.add_argument(
        "--sample-mode",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: every thread at every instant, a blocked one as <waiting> under the "
        "function that waits (shares of elapsed time); cpu: only threads on a CPU "
        "(shares of CPU time) (wall)",
    )
    run.add_argument(
        "--follow-children",
        action="store_true",
        help="child processes profile too, each into <stem>.<pid><ext>",
    )
    run.add_argument(
        "--no-report",
        dest="report",
        action="store_false",
        help="write no HTML report (by default <trace stem>.report.html, beside the trace)",
    )
    run.add_argument("script", help="the script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    run.set_defaults(func=cmd_run)

    st = sub.add_parser(
        "stats",
        help="statistics of a trace (mxprof, PyTorch, viztracer, nvprof/Nsight SQLite, ...)",
    )
    st.add_argument(
        "traces", nargs="+", metavar="TRACE", help="a trace or a job's manifest; several: together"
    )
    st.add_argument("--sort", default="total", choices=sorted(ROW_SORT_KEYS), help="order")
    st.add_argument("--format", default="table", choices=("table", "json"))
    st.add_argument("--top", type=_count, default=None, help="show only the first N rows")
    _executor_options(st)
    st.set_defaults(func=cmd_stats)

    mg = sub.add_parser("merge", help="put several traces on one timeline")
    mg.add_argument("traces", nargs="+", help="input traces")
    mg.add_argument(
        "-o", "--output", required=True, help="the merged trace (.json, .json.gz or .pftrace)"
    )
    mg.add_argument(
        "--window",
        metavar="START:END",
        help="keep what overlaps this span: seconds from the start (10:12) or steps (#100:#120)",
    )
    mg.add_argument(
        "--ranks", metavar="LIST", help="keep these ranks' inputs: 0-3,7 or worker:0-3,server:1"
    )
    _executor_options(mg)
    mg.set_defaults(func=cmd_merge)

    rr = sub.add_parser("report", help="one self-contained HTML page of traces")
    rr.add_argument(
        "traces", nargs="+", help="trace files or a job's manifest (several: side by side)"
    )
    rr.add_argument(
        "-o",
        "--output",
        default=None,
        help="the HTML file to write (<first trace's stem>.report.html, beside it)",
    )
    rr.add_argument(
        "--baseline", action="append", metavar="BASE", help="compare with this trace (repeatable)"
    )
    rr.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="processes the page is built with: 1, all in this one; 2 or more, the hints in a "
        f"second process beside the sections (default: the cores, {engine.default_jobs()}); "
        "the inputs are read here",
    )
    rr.add_argument(
        "--engine",
        type=_engine,
        default="local",
        metavar="ENGINE",
        help="local only: the page is built from every event in this process (a Dask "
        "engine is refused with the reason)",
    )
    rr.set_defaults(func=cmd_report)

    rp = sub.add_parser("repair", help="rewrite a trace cut short (a killed process) as valid JSON")
    rp.add_argument("trace")
    rp.add_argument("-o", "--output", default=None, help="write here instead of over the input")
    rp.set_defaults(func=cmd_repair)

    df = sub.add_parser(
        "diff",
        usage="mxprof diff [options] BASE NEW\n       mxprof diff [options] BASE... -- NEW...",
        help="compare profiles name by name (and function by function, when sampled)",
        description="Per range name: count, total, avg, P50, P99 of both sides, and the typical "
        "shift: how much the typical duration moved, in percent, with a 99%% confidence "
        "interval. The unit of noise is not the event but a block (a run's events of a name, "
        "in time order, cut into at most 32 blocks of at least 4, each giving its median) or, "
        "with several runs a side (BASE... -- NEW...), the run: the interval is Student's t on "
        "the difference of the sides' geometric means of block medians, from the spread of "
        "the blocks (one run a side) or of the runs (several). A row is flagged only when the "
        "whole interval clears --threshold percent and the typical duration moved by at least "
        "--min-change. With one run a side a slower machine cannot be told from slower code: "
        "give several runs a side (five or more) to gate on. When both sides have stack "
        "samples, each function's inclusive and self share is compared too, flagged when its "
        "interval (two proportions, 99%% over the number of functions, Bonferroni) clears "
        "--threshold percentage points. The profiler's own ranges are left out.",
        epilog="Exit status: 0; 1 with --fail-on-regression when a regression (a range "
        "slower) is flagged; 2 when the inputs cannot be read, or have no range name in "
        "common and not both have stack samples. A flagged function share never gives 1: "
        "shares are relative (one function growing makes the others shrink).",
    )
    df.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="BASE NEW; or the base runs, then --, then the new runs",
    )
    df.add_argument("--format", default="table", choices=("table", "json"), help="output (table)")
    df.add_argument(
        "--threshold",
        type=_percent,
        metavar="PCT",
        default=5.0,
        help="percent the typical shift's interval must clear to be flagged, and percentage "
        "points a function share's must (5)",
    )
    df.add_argument(
        "--min-change",
        type=_duration_ns,
        metavar="TIME",
        default=MIN_CHANGE_NS,
        help="the least change of the typical duration that is flagged, e.g. 2us, 0.5ms (1us)",
    )
    df.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit with status 1 when a regression (a range slower) is flagged; "
        "function shares never fail",
    )
    df.set_defaults(func=cmd_diff)

    rk = sub.add_parser(
        "ranks", help="per step and rank compute/communication/waiting/idle, and the straggler"
    )
    rk.add_argument(
        "traces", nargs="+", help="one merged trace, one trace per rank, or a job's manifest"
    )
    rk.add_argument("--format", default="table", choices=("table", "json"), help="output (table)")
    rk.add_argument("--top", type=_count, default=10, help="rows of the spread table (10)")
    rk.add_argument("--steps", type=_count, default=None, help="rows of the last N steps only")
    _executor_options(rk)
    rk.set_defaults(func=cmd_ranks)

    hn = sub.add_parser(
        "hints",
        help="what to look at first: the report's hints, with their evidence",
        epilog="Exit status: 0 (hints or none); 2 when a trace cannot be read.",
    )
    hn.add_argument("traces", nargs="+", help="one trace, a merged trace, or one per process")
    hn.add_argument(
        "--format",
        default="text",
        choices=("text", "json"),
        help="text, or json: a list of {rule, severity, title, evidence, suggestion, subjects}",
    )
    hn.set_defaults(func=cmd_hints)

    ex = sub.add_parser(
        "export",
        help="write a trace's stack samples for another tool (speedscope, flame graphs)",
        description="speedscope: speedscope's JSON file format, one sampled profile per "
        "thread, each sample weighing 1/sample_rate seconds (weight 1, unit none, when the "
        "trace does not record its rate). collapsed: folded stacks (flamegraph.pl, inferno, "
        "speedscope), one line 'frame;...;frame COUNT' per distinct stack, outermost frame "
        "first, frames 'function (file:line)', all threads folded together unless --threads.",
        epilog="Exit status: 0; 2 when the trace cannot be read, holds no stack samples, "
        "or the output cannot be written.",
    )
    ex.add_argument(
        "traces", nargs="+",
        help="a trace with stack samples (recorded with sample_rate); parquet: one or more "
        "traces, placed on one clock as merge places them",
    )  # fmt: skip
    ex.add_argument(
        "--format", required=True, choices=(*export.FORMATS, "parquet"),
        help="what to write; parquet: every event as tables slice, counter, instant, thread, "
        "process, by rank (docs/sql.md; needs pip install \"mxprof[sql]\")",
    )  # fmt: skip
    ex.add_argument(
        "-o", "--output", required=True, help="the file to write (-: stdout); parquet: a folder"
    )
    ex.add_argument(
        "--threads",
        action="store_true",
        help="collapsed: start each stack with a frame naming its thread",
    )
    ex.add_argument(
        "--window",
        metavar="START:END",
        help="only the samples taken in this span, seconds on the trace's clock (10:12); "
        "reads only the blocks of an indexed trace that may hold them",
    )
    _executor_options(ex)  # (parquet: the inputs converted at once)
    ex.set_defaults(func=cmd_export)

    sq = sub.add_parser(
        "sql",
        help="query traces with SQL (DuckDB): tables slice, counter, instant, thread, process",
        description="Run one SELECT over the traces' Parquet tables (converted on first use "
        "and cached beside the first trace in .mxprof-sql-*/, converted again when a trace "
        "changes) or over folders written by export --format parquet. Built-in views: "
        "step_breakdown, no_range, collective_waits (docs/sql.md). Needs "
        'pip install "mxprof[sql]".',
        epilog="Exit status: 0; 2 when the query does not parse or run (DuckDB's message), "
        "an input cannot be read, or duckdb/pyarrow is missing.",
    )
    sq.add_argument("query", help="one SELECT statement")
    sq.add_argument(
        "inputs",
        nargs="+",
        metavar="TRACE_OR_DIR",
        help="traces, a job's manifest, or Parquet folders",
    )
    sq.add_argument(
        "--format", choices=("table", "csv", "json"), default="table", help="output (table)"
    )
    _executor_options(sq)  # (the traces converted at once, the first time)
    sq.set_defaults(func=cmd_sql)

    vw = sub.add_parser(
        "view",
        help="open a trace (or a window of it) in the Perfetto UI, served from 127.0.0.1",
        description="Cut the trace (--window, --ranks, as merge does), serve it on "
        "127.0.0.1:PORT to https://ui.perfetto.dev only, print the URL that opens it, "
        "and exit once the UI has fetched it (or after --requests requests, or --timeout "
        "seconds without one).",
        epilog="Exit status: 0 once served; 2 when the trace cannot be read, the port is "
        "taken, or nothing fetched the trace within --timeout.",
    )
    vw.add_argument("traces", nargs="+", help="a trace, or one per process (merged first)")
    vw.add_argument(
        "--window", type=parse_window, help="as merge --window: A:B seconds or #A:#B steps"
    )
    vw.add_argument("--ranks", type=parse_ranks, help="as merge --ranks: e.g. 0-3,server:0")
    vw.add_argument("--port", type=int, default=9001, help="the local port (9001, as Perfetto's)")
    vw.add_argument(
        "--requests", type=_count, default=8, metavar="N",
        help="serve at most N requests, then exit (8)",
    )  # fmt: skip
    vw.add_argument(
        "--timeout", type=_positive_float, default=300.0, metavar="S",
        help="give up after S seconds without a request (300)",
    )  # fmt: skip
    vw.add_argument("--open", action="store_true", help="also open the URL in a web browser")
    vw.set_defaults(func=cmd_view)

    ct = sub.add_parser(
        "ctl",
        help="look into a running process that uses mxprof (list, status, where, start ...)",
        description="Talk to the control endpoint of a running process that uses mxprof's "
        "live API (a Unix socket only this user can reach): 'ctl list', or 'ctl PID ACTION' "
        "with ACTION one of: status (default), where (every thread's stack and open "
        "ranges), start / stop / dump (record on demand; a process that was idle is idle "
        "again after), snapshot (flight recorder), top (ranges over the last interval, "
        "until interrupted), attach (CPython 3.14+: load mxprof into a process without it).",
        epilog="Exit status: 0; 2 when the process is gone, is not an mxprof process, "
        "refuses, or does not answer within --timeout.",
    )
    ct.add_argument("target", help="'list', or the process id to talk to")
    ct.add_argument("action", nargs="?", choices=_ctlclient.ACTIONS, help="what to do (status)")
    ct.add_argument("--format", choices=("text", "json"), default="text", help="output (text)")
    ct.add_argument(
        "--timeout", type=_positive_float, default=_ctlclient.DEFAULT_TIMEOUT,
        help="seconds to wait for an answer (2)",
    )  # fmt: skip
    ct.add_argument(
        "--job", action="store_true",
        help="PID is a distributed job's rank-0 worker: every process answers (status, where, "
        "snapshot) or records (start; dump and stop write one merged trace, -o names it)",
    )  # fmt: skip
    ct.add_argument(
        "--duration", type=_positive_float, metavar="S", help="start: seconds to record, then write"
    )
    ct.add_argument(
        "-o", "--output", metavar="FILE",
        help="start: the trace file (default: mxprof-ctl-<pid>-<time>.json in the target's "
        "folder); with --job, the merged trace",
    )  # fmt: skip
    ct.add_argument("--sample", type=_sample_rate, metavar="HZ", help="start: also sample stacks")
    ct.add_argument(
        "--interval", type=_positive_float, default=1.0, metavar="S", help="top: seconds per frame"
    )
    ct.add_argument("--iterations", type=_count, metavar="N", help="top: stop after N frames")
    ct.set_defaults(func=cmd_ctl)
    return p


# What a command raises for bad input or usage, each naming its file or
# argument: main prints it after the command's name and returns 2.
_BAD_INPUT = (
    CommandError,
    TraceFormatError,  # TraceReadError too: a path that cannot be read
    OSError,  # an output that cannot be written (OutputError ...)
    ConfigError,
    DiffError,
    export.ExportError,
    _ctlclient.CtlError,
    SqlError,
    MissingExtra,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mxprof`` and ``python -m mxprof``; returns the exit
    status (see the module's docstring).

    Example:
        >>> main(["stats", "missing.json"])  # doctest: +SKIP
        2
    """
    words = list(sys.argv[1:] if argv is None else argv)
    # diff's BASE... -- NEW...: argparse drops the --, so the sides are split here.
    new_runs = None
    if words[:1] == ["diff"] and "--" in words:
        cut = words.index("--")
        words, new_runs = words[:cut], words[cut + 1 :]
    args = parser().parse_args(words)  # a usage error exits 2 here (argparse)
    args.new_runs = new_runs
    try:
        # run's stdout is its script's: how the script meets a closed pipe is its own.
        with _output_to_a_reader(guarded=args.command != "run"):
            status: int = args.func(args)
    except _BAD_INPUT as e:
        print(f"mxprof {args.command}: {e}", file=sys.stderr)
        return 2
    return status


class _Stdout:
    """stdout as a command writes it: once the reader has gone (a pipe closed
    early), what follows is dropped instead of raising BrokenPipeError."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.out.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.out.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.gone = True
        # What the stream still buffers would fail again when the interpreter
        # flushes it at exit (a warning and status 120): send it nowhere.
        try:
            fd = self.out.fileno()
        except (OSError, ValueError):  # not a file (a test's capture): nothing buffered
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


@contextmanager
def _output_to_a_reader(guarded: bool) -> Iterator[None]:
    """sys.stdout guarded by ``_Stdout`` for the command, flushed before it ends."""
    if not guarded:
        yield
        return
    out = sys.stdout
    guard = _Stdout(out)
    sys.stdout = cast(TextIO, guard)
    try:
        yield
        guard.flush()
    finally:
        sys.stdout = out

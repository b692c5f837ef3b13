"""Merge several Chrome traces onto one timeline.

Each input's timestamps are shifted by the difference between its
``baseTimeNanoseconds`` (the wall-clock time of its ts 0) and the earliest
input's, so events line up by wall-clock time; each input keeps its own
process tracks (pids that two inputs share are renumbered).

Inputs from a distributed job (``mxprof.distributed``) carry
``distributedInfo`` with their clock's offset estimates: their events are
moved onto the rank-0 worker's clock (``ClockModel.offset_at``; a drift is
applied only where it exceeds its error bound), their processes are named
by role, rank, host and pid (``processes.display_name``), and the merged
file's ``distributedInfo.ranks`` lists every rank with its clock and, as
``merged_pid``, the pid its process has in the merged file (beside ``pid``,
the one it was recorded with): readers join identity to events by it
(``trace.processes``).  The inputs' tallies (``otherData``) are summed
into the merged file's.

Times are moved in integer ns, both ends of a range: an event's start and
its end (``ts + dur``, rounded from the exact values in the file, as
``mxprof.load`` does) each go through the input's mapping, which never
decreases.  So on every thread track, ranges nested in an input stay
nested, back-to-back ranges do not overlap, and instants, counters, async
and flow events keep their order and stay inside the ranges they fell in.

Inputs stream through: one block of events at a time for inputs in mxprof's
own one-event-per-line shape (others are read whole, one input at a time),
so memory grows with the largest block and the processes, not the events.
JSON output is written event by event; Perfetto output one input at a time
(its events sorted by time within it). ``window`` and ``ranks`` cut a
viewer-sized timeline out of a big job.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import IO, Any, NamedTuple, Union

from msgspec.structs import force_setattr

from .._tallies import TALLIES
from .._tracejson import dumps as trace_json
from .._version import __version__
from ..errors import TraceFormatError
from . import _scan, manifest
from ._convert import Converter, ident, span_ns, whole_ns
from .clock import IDENTITY, ClockModel
from .dataloader import FlowCollector
from .engine import Executor
from .gpu import align_inputs, is_nvidia
from .model import Event, Trace, base_time_ns, ns_ratio, read_lines, round_ratio
from .processes import display_name, from_info
from .reader import GZIP_MAGIC, RawEvent, open_trace, read_raw
from .steps import is_frame, is_profiler_step, number
from .writer import JSON_GZ, PERFETTO, PerfettoWriter, file_format

_ROLE_ORDER = {"worker": 0, "server": 1}


def _distributed(path: str, meta: dict[str, Any]) -> tuple[dict[str, Any], ClockModel] | None:
    """An input's distributedInfo and clock model (None: not from a distributed job)."""
    info = meta.get("distributedInfo")
    if not isinstance(info, dict):
        return None
    try:
        clock = ClockModel.from_json(info.get("clock", {"estimates": []}))
    except ValueError as e:
        raise TraceFormatError(f"{path}: bad distributedInfo.clock: {e}") from None
    return info, clock


# What each rank of one job says alike of the job (distributedInfo's keys).
JOB_KEYS = ("world_size", "num_workers", "num_servers", "backend")


class JobInput(NamedTuple):
    """What an input says of its job: its path, its file name, the job's keys
    (``JOB_KEYS``) and the (role, rank) of each of its ranks."""

    path: str
    file: str
    job: dict[str, Any]
    ranks: list[tuple[str, int]]


def job_input(path: str, info: Any) -> JobInput:
    """An input's :class:`JobInput` from its ``distributedInfo`` (a rank's own,
    or a merged file's with its ``ranks`` list; anything else: no job)."""
    file = os.path.basename(path)
    if not isinstance(info, dict):
        return JobInput(path, file, {}, [])
    job = {k: info[k] for k in JOB_KEYS if k in info}
    listed = info.get("ranks")
    entries = [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else [info]
    ranks = []
    for r in entries:
        role, rank = r.get("role"), r.get("rank")
        if type(rank) is int:
            ranks.append((role if isinstance(role, str) and role else "worker", rank))
    return JobInput(path, file, job, ranks)


def one_job(inputs: Sequence[JobInput]) -> None:
    """Refuse inputs that are not one job: two that say different world sizes
    (or worker or server counts, or backends), or the same rank (role and
    rank) in two inputs (the same file given twice too).  ``merge``, the
    readers that place inputs on its clock (``timeline``) and ``mxprof
    ranks`` all check this way.

    Raises:
        TraceFormatError: naming the two inputs and what they say.
    """
    for key in JOB_KEYS:
        said: dict[Any, str] = {}
        for one in inputs:
            if key in one.job:
                said.setdefault(one.job[key], one.file)  # the first input to say it
        if len(said) > 1:
            (a, fa), (b, fb) = list(said.items())[:2]
            raise TraceFormatError(
                f"inputs of different jobs: {fa} says {key} {a!r}, {fb} says {b!r}"
            )
    seen: dict[tuple[str, int], int] = {}
    for k, one in enumerate(inputs):
        for role, rank in one.ranks:
            first = seen.setdefault((role, rank), k)
            if first != k:
                raise TraceFormatError(
                    f"{role} {rank} is in two inputs, {inputs[first].path} and {one.path}: "
                    "give each rank once"
                )


def _moves(metadata: Sequence[dict[str, Any]], dist: Sequence[Any]) -> list[_Move]:
    """Each input's mapping onto the merged axis (its ts 0: the earliest base,
    on the reference clock)."""
    bases = [base_time_ns(m) for m in metadata]
    clocks = [d[1] if d is not None else IDENTITY for d in dist]
    # Each base on the reference clock: the rank-0 worker's for distributed inputs.
    corrected = [None if b is None else b + c.offset_at(b) for b, c in zip(bases, clocks)]
    known = [b for b in corrected if b is not None]
    ref = min(known) if known else 0
    return [_Move(base, clock, ref) for base, clock in zip(bases, clocks)]


def timeline(
    inputs: Sequence[tuple[str, dict[str, Any]]],
) -> list[tuple[dict[str, Any] | None, Callable[[int], int]]]:
    """Each input's ``distributedInfo`` (None: none) and its mapping of ns on
    its own axis to ns on the axis ``merge`` writes, given (path, metadata).

    For readers that place inputs on the merged clock without merging them
    (``mxprof export --format parquet``).

    Raises:
        TraceFormatError: a ``distributedInfo.clock`` that is not one, or
            inputs that are not one job (:func:`one_job`).

    Example:
        >>> [(info, move(5)) for info, move in timeline([("a.json", {})])]
        [(None, 5)]
    """
    dist = [_distributed(path, meta) for path, meta in inputs]
    one_job([job_input(path, meta.get("distributedInfo")) for path, meta in inputs])
    moves = _moves([meta for _, meta in inputs], dist)
    return [(d[0] if d is not None else None, m) for d, m in zip(dist, moves)]


def _fresh_pid(pid: Any, used: set[Any]) -> Any:
    """pid itself, or the next integer no input uses yet."""
    if pid not in used:
        return pid
    candidate = max([p for p in used if isinstance(p, int)], default=0) + 1
    while candidate in used:
        candidate += 1
    return candidate


@dataclass(frozen=True)
class _Move:
    """One input's time mapping: ns on its own axis to ns on the merged one."""

    base: int | None  # the input's ts 0 on its wall clock; None: taken as it is
    clock: ClockModel  # its wall clock to the reference clock
    ref: int  # the merged file's ts 0 on the reference clock

    def __call__(self, t_ns: int) -> int:
        if self.base is None:
            return t_ns
        wall = self.base + t_ns
        return wall + self.clock.offset_at(wall) - self.ref


def _moved(event: dict[str, Any], move: _Move) -> dict[str, Any]:
    """A copy of event with its start and, if it has a length, its end moved."""
    out = dict(event)
    ts = ns_ratio(event.get("ts"))
    if ts is None or event.get("ph") == "M":
        return out
    start = move(round_ratio(*ts))
    out["ts"] = start / 1000
    length = ns_ratio(event["dur"]) if "dur" in event else None
    if length is not None:
        end = round_ratio(ts[0] * length[1] + length[0] * ts[1], ts[1] * length[1])
        out["dur"] = (move(end) - start) / 1000
    return out


Window = tuple[str, float, float]  # ("seconds" | "steps", start, end)
_WINDOW = re.compile(r"^\s*(#?)([-+0-9.eE]+)s?\s*:\s*(#?)([-+0-9.eE]+)s?\s*$")
_RANKS = re.compile(r"^(?:(worker|server):)?(\d+)(?:-(\d+))?$")


def parse_window(text: str) -> Window:
    """``START:END`` in seconds from the merged start, or ``#A:#B`` in step numbers.

    Raises:
        ValueError: the text is neither, or the end comes before the start.

    Example:
        >>> parse_window("1.5:3"), parse_window("#10:#20")
        (('seconds', 1.5, 3.0), ('steps', 10.0, 20.0))
    """
    m = _WINDOW.match(text)
    if m is None or bool(m.group(1)) != bool(m.group(3)):
        raise ValueError(
            f"window {text!r}: expected START:END in seconds (1.5:3) or #A:#B in step numbers"
        )
    try:
        lo, hi = float(m.group(2)), float(m.group(4))
    except ValueError:
        raise ValueError(
            f"window {text!r}: {m.group(2)!r} or {m.group(4)!r} is no number"
        ) from None
    if not lo <= hi:
        raise ValueError(f"window {text!r}: the end comes before the start")
    return ("steps" if m.group(1) else "seconds", lo, hi)


def parse_ranks(text: str) -> list[tuple[str | None, int, int]]:
    """``0-3,7`` or ``worker:0-3,server:1``: (role or None, first, last) per item.

    Raises:
        ValueError: an item is neither form.

    Example:
        >>> parse_ranks("0-3,server:1")
        [(None, 0, 3), ('server', 1, 1)]
    """
    out = []
    for item in text.split(","):
        m = _RANKS.match(item.strip())
        if m is None:
            raise ValueError(f"ranks {text!r}: {item!r} is not N, N-M or worker:/server: N[-M]")
        first = int(m.group(2))
        last = int(m.group(3)) if m.group(3) else first
        if last < first:
            raise ValueError(f"ranks {text!r}: {item!r} ends before it begins")
        out.append((m.group(1), first, last))
    return out


class _Input:
    """One input: its metadata at once, its events block by block on demand."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.truncated = False
        self.held: list[RawEvent] | None = None  # events replaced in memory (aligned)
        self.index: list[_scan.Block] | None = None  # a plain file's blocks (see blocks)
        try:
            with open_trace(path) as f:
                self.metadata: dict[str, Any] = _scan.metadata(f)  # the events are read later
                plain = f.seek(0) == 0 and f.read(2) != GZIP_MAGIC
                if plain:
                    self.index = _scan.index(self.metadata, f.seek(0, 2))
            self.lines = True
        except _scan.NotLines:  # another shape: read whole, here and again later
            self.lines = False
            _, self.metadata, self.truncated = read_raw(path)

    def blocks(self, near: tuple[float, float] | None = None) -> Iterator[list[RawEvent]]:
        """The events as dicts, block by block.

        Args:
            near: (first, last) µs on the input's own axis: of a file in
                mxprof's shape only the events that may overlap it (and
                those without a time) are decoded as dicts; the caller
                still checks each on the merged axis.
        """
        if self.held is not None:
            yield self.held
            return
        if not self.lines:
            yield read_raw(self.path)[0]
            return
        if near is not None and self.index is not None:
            # Only the blocks whose events may overlap near (µs; the index
            # says ns), those that define sample ids, the head and the tail.
            lo, hi = near[0] * 1000, near[1] * 1000

            def keep(b: _scan.Block) -> bool:
                return b.defines or (b.first_ns <= hi and b.last_ns >= lo)

            with open(self.path, "rb") as indexed:
                texts = _scan.indexed_blocks(indexed, self.index, keep)
                try:
                    first = next(texts, None)  # the file checked against its index first
                except _scan.NotLines:
                    pass  # changed since its index was written: read it all (below)
                else:
                    try:
                        for text in itertools.chain(() if first is None else (first,), texts):
                            yield _scan.raw_events(_scan.near(text, *near))
                    except _scan.NotLines:
                        raise self._damaged() from None
                    return
        with open_trace(self.path) as f:
            blocks = _scan.blocks(f)
            try:
                while True:
                    text = next(blocks)
                    yield _scan.raw_events(text if near is None else _scan.near(text, *near))
            except StopIteration:
                return
            except _scan.NotLines:
                raise self._damaged() from None

    def _damaged(self) -> TraceFormatError:
        return TraceFormatError(
            f"{self.path}: damaged (or changed while it was merged): read it with "
            "mxprof.load for where"
        )


def _align_databases(inputs: list[_Input]) -> None:
    """NVIDIA databases among the inputs set onto the clock of the mxprof trace
    they match (``gpu.align_inputs``); only then are the inputs held whole."""
    if not any(is_nvidia(inp.metadata) for inp in inputs):
        return
    whole = [
        (inp.path, [e for block in inp.blocks() for e in block], inp.metadata, inp.truncated)
        for inp in inputs
    ]
    for inp, (_, events, metadata, _) in zip(inputs, align_inputs(whole)):
        if is_nvidia(metadata):
            inp.metadata, inp.held = metadata, events


def _selected(
    inputs: list[_Input], dist: list[Any], ranks: Sequence[tuple[str | None, int, int]]
) -> list[int]:
    """Indices of the inputs ranks names (an input without distributedInfo: its position)."""
    keep = []
    for k, d in enumerate(dist):
        role, rank = (str(d[0].get("role")), d[0].get("rank")) if d is not None else (None, k)
        if not isinstance(rank, int):
            continue
        if any((want is None or want == role) and lo <= rank <= hi for want, lo, hi in ranks):
            keep.append(k)
    return keep


def _moved_fast(event: RawEvent, shift: int) -> RawEvent | None:
    """_moved for a constant shift when the times are whole ns as floats or ints (else None)."""
    start = whole_ns(event.get("ts"))
    if start is None:
        return None
    out = dict(event)
    out["ts"] = (start + shift) / 1000
    if "dur" in event:
        length = whole_ns(event["dur"])
        if length is None:
            return None
        out["dur"] = length / 1000
    return out


def _process_name(path: str, d: Any, pid: Any, own: Any) -> str:
    """A process's name in the merged file: its role and rank (distributed
    inputs, by the report's label rule: ``processes.display_name``), else its
    own name (or none) and its file's."""
    if d is not None:
        return display_name(from_info(d[0], pid))
    if own is not None:
        return f"{own} [{os.path.basename(path)}]"
    return f"{os.path.basename(path)} (pid {pid})"


class _JsonOut:
    """Chrome JSON in mxprof's shape (one event per line), plain or gzip."""

    def __init__(self, f: IO[bytes], head: dict[str, Any]) -> None:
        self.f = f
        self.first = True
        members = trace_json(head)[1:-1]
        self.f.write(("{" + members + ', "traceEvents": [\n').encode("utf-8"))

    def add(self, events: list[RawEvent]) -> None:
        if not events:
            return
        text = ",\n".join(trace_json(e) for e in events)
        self.f.write(((",\n" if not self.first else "") + text).encode("utf-8"))
        self.first = False

    def close(self, tail: dict[str, Any]) -> None:
        members = trace_json(tail)[1:-1]
        self.f.write(("\n],\n" + members + "}\n").encode("utf-8"))


class _PerfettoOut:
    """Perfetto protobuf, one input (converted and sorted) at a time."""

    def __init__(self, f: IO[bytes], base_time: int | None) -> None:
        # Merged times are seldom negative (an input's ts below 0): room for a day of them.
        self.writer = PerfettoWriter(f, base_time, 86_400 * 10**9)
        self.converter = Converter()

    def add(self, events: list[RawEvent]) -> None:
        for e in events:
            self.converter.add(e)

    def end_input(self) -> None:
        self.writer.add(Trace._of(self.converter, None, False, None))
        self.converter = Converter()

    def add_input(
        self, inp: _Input, move: _Move, d: Any, used: set[Any]
    ) -> tuple[int, dict[Any, Any]]:
        """An input in mxprof's shape, read straight into Events (no dicts):
        (events written, its pids renumbered)."""
        converted, _ = read_lines(inp.path, None)
        shift = move(0) if move.clock.constant else None
        events: list[Event] = []
        pids: dict[Any, Any] = {}
        for thread in converted.finish().values():
            assert isinstance(thread, list)  # read_lines(..., None) fills lists
            for e in thread:
                pid = e.pid
                if pid not in pids:
                    pids[pid] = _fresh_pid(pid, used)
                    used.add(pids[pid])
                start = e.ts + shift if shift is not None else move(e.ts)
                if e.dur is not None:
                    end = e.end + shift if shift is not None else move(e.end)
                    force_setattr(e, "dur", end - start)
                force_setattr(e, "ts", start)
                force_setattr(e, "pid", pids[pid])
                events.append(e)
        names = {
            new: _process_name(inp.path, d, pid, converted.process_names.get(pid))
            for pid, new in pids.items()
        }
        threads = {
            (pids[pid], tid): name
            for (pid, tid), name in converted.thread_names.items()
            if pid in pids
        }
        self.writer.add(Trace(events, process_names=names, thread_names=threads))
        return len(events), pids


Output = Union[_JsonOut, _PerfettoOut]


def merge(
    paths: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    sources: Sequence[str] | None = None,
    window: Window | None = None,
    ranks: Sequence[tuple[str | None, int, int]] | None = None,
    info: dict[str, Any] | None = None,
    other: Callable[[int], dict[str, Any]] | None = None,
    executor: Executor | None = None,
) -> dict[str, Any]:
    """Write one trace holding every input's events, aligned by wall clock.

    Inputs without a base time are taken as they are (their ts axis is
    assumed to be the earliest input's). Inputs stream through (see the
    module docstring); the output is written to a temporary file beside it
    and renamed into place.

    Args:
        paths: the traces to merge (any form ``mxprof.load`` reads), or a
            job's manifest (``trace.manifest``), which stands for the traces
            it names; the summary then has ``"missing"``: the processes the
            manifest names as missing and those whose file has moved or been
            cut since.
        output: the merged file, in the format its suffix names (as for
            ``set_config(filename=...)``): ``.json`` (object form, like
            mxprof's own), ``.json.gz`` (gzip-compressed), ``.pftrace`` or
            ``.perfetto-trace`` (Perfetto protobuf: ranges, instants,
            counters and names; the JSON metadata has no place there).
        sources: what the merged file's ``otherData.merged_from`` names for
            each input, in order (default: the paths as given).
            ``distributed.collect`` merges temporary copies and passes each
            process's label and file name instead.
        window: ``parse_window``'s: keep only what overlaps this span of the
            merged timeline (seconds from its start, or from the start of
            step A to the end of step B, steps of any input); ranges that
            overlap are kept whole, names always.
        ranks: ``parse_ranks``'s: keep only the inputs of these ranks (an
            input from no distributed job counts as the rank of its place
            among the inputs, from 0).
        info: keys added to the merged file's ``distributedInfo`` (made
            when no input has one); ``distributed.collect`` names the
            processes it is missing there.
        other: given the merged file's ts 0 (``baseTimeNanoseconds``, ns
            on the reference clock), keys added to its ``otherData``
            (JSON outputs); ``distributed``'s job-wide flight recorder
            snapshot puts its trigger there, on the merged timeline.
        executor: where a window's per-input work runs (``trace.engine``):
            finding its steps, and decoding the events that may lie in it,
            one input a task; only those events come back, and the merged
            file is the same as without (default: here, one input after
            another).

    Returns:
        A summary: ``{"events": n, "inputs": [{"path", "pids", "shift_us",
        "truncated"}, ...]}`` (only the inputs kept), with ``"window_ns"``
        when a window was given.

    Raises:
        TraceFormatError: fewer than one input, an input is not a trace, or
            ranks keeps none.
        ValueError: sources does not name every input.

    Example:
        >>> merge(["worker.json", "server.json"], "job.pftrace",
        ...       window=parse_window("10:12"))  # doctest: +SKIP
    """
    if not paths:
        raise TraceFormatError("merge: no input traces")
    if sources is not None and len(sources) != len(paths):
        raise ValueError(f"merge: {len(sources)} sources named for {len(paths)} inputs")
    # A job's manifest (distributed.collect(shared=True)) stands for the files it names.
    listed = manifest.expand([os.fspath(p) for p in paths], sources)
    if listed.manifests:
        paths, sources = listed.paths, listed.sources
        if listed.missing:
            info = {**(info or {})}
            info["missing"] = [*info.get("missing", []), *listed.missing]
    inputs = [_Input(os.fspath(p)) for p in paths]
    _align_databases(inputs)
    dist = [_distributed(inp.path, inp.metadata) for inp in inputs]
    one_job([job_input(inp.path, inp.metadata.get("distributedInfo")) for inp in inputs])
    names = list(sources) if sources is not None else [inp.path for inp in inputs]
    if ranks is not None:
        keep = _selected(inputs, dist, ranks)
        if not keep:
            raise TraceFormatError("merge: --ranks keeps none of the inputs")
        inputs, dist, names = (
            [inputs[k] for k in keep],
            [dist[k] for k in keep],
            [names[k] for k in keep],
        )
    moves = _moves([inp.metadata for inp in inputs], dist)
    ref = moves[0].ref
    span = _window_ns(window, inputs, moves, executor) if window is not None else None
    near = _near_events(inputs, moves, span, executor) if span is not None else {}
    fmt = file_format(output)
    target = os.fspath(output)
    temporary = f"{target}.tmp{os.getpid()}"
    head = {"displayTimeUnit": "ms", "baseTimeNanoseconds": ref}
    try:
        with open(temporary, "wb") as raw_file:
            f: IO[bytes] = raw_file
            if fmt == JSON_GZ:
                f = gzip.GzipFile(fileobj=raw_file, mode="wb", compresslevel=6, mtime=0)  # type: ignore[assignment]
            out: Output = _PerfettoOut(f, ref) if fmt == PERFETTO else _JsonOut(f, head)
            flows = FlowCollector()
            count, summary, ranks_info = _write_inputs(inputs, dist, moves, span, out, flows, near)
            if isinstance(out, _JsonOut):
                # DataLoader batches joined to the waits for them: the arrows
                # need both ends on one clock, so the merge writes them.
                joined = flows.flows()
                out.add(joined)
                count += len(joined)
            doc: dict[str, Any] = {}
            if ranks_info or info:
                first = next((d[0] for d in dist if d is not None), {})
                doc["distributedInfo"] = {
                    "world_size": first.get("world_size"),
                    "num_workers": first.get("num_workers"),
                    "num_servers": first.get("num_servers"),
                    "backend": first.get("backend"),
                    "ranks": sorted(
                        ranks_info,
                        key=lambda r: (_ROLE_ORDER.get(str(r.get("role")), 2), r.get("rank")),
                    ),
                    **(info or {}),
                }
            doc["otherData"] = {
                "mxprof_version": __version__,
                "merged_from": names,
                **_tallies(inputs),
            }
            if span is not None:
                doc["otherData"]["window_ns"] = list(span)
            if other is not None:
                doc["otherData"].update(other(ref))
            if isinstance(out, _JsonOut):
                out.close(doc)
            if f is not raw_file:
                f.close()
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    result: dict[str, Any] = {"events": count, "inputs": summary}
    if span is not None:
        result["window_ns"] = list(span)
    if listed.manifests:
        result["missing"] = listed.missing
    return result


def _tallies(inputs: list[_Input]) -> dict[str, int]:
    """The core's tallies summed over the inputs that carry them (none: {}), so
    that a merged file says what its processes dropped or misused."""
    found: dict[str, int] = {}
    for inp in inputs:
        other = inp.metadata.get("otherData")
        if not isinstance(other, dict):
            continue
        for key in TALLIES:
            value = other.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                found[key] = found.get(key, 0) + value
    return found


def _write_inputs(
    inputs: list[_Input],
    dist: list[Any],
    moves: list[_Move],
    span: tuple[int, int] | None,
    out: Output,
    flows: FlowCollector,
    decoded: dict[int, list[RawEvent]],
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    """Every input's events, moved, renumbered and labelled, into out (and
    flows, which keeps the DataLoader's); decoded: by input index, the events
    of inputs already cut to the window (``_near_events``)."""
    used: set[Any] = set()
    count = 0
    summary: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for k, (inp, move, d) in enumerate(zip(inputs, moves, dist)):
        shift = move(0) if move.clock.constant else None
        pids: dict[Any, Any] = {}
        active: set[Any] = set()  # its pids with events (not only metadata)
        named: set[Any] = set()
        # Perfetto output of a file in mxprof's shape: straight into Events. A
        # window: only what may lie in it is decoded as dicts.
        whole = isinstance(out, _PerfettoOut) and inp.lines and span is None
        if whole and isinstance(out, _PerfettoOut):
            written, pids = out.add_input(inp, move, d, used)
            active = set(pids)
            count += written
        near = None
        if span is not None and shift is not None:
            near = ((span[0] - shift) / 1000 - 1, (span[1] - shift) / 1000 + 1)
        blocks = [decoded[k]] if k in decoded else inp.blocks(near) if not whole else ()
        for block in blocks:
            kept = []
            for ev in block:
                pid = ev.get("pid")
                if pid is not None and type(pid) is not int and type(pid) is not str:
                    # NaN, Infinity, an object: the model's identity of it (hashable)
                    pid = ident(pid)
                if pid not in pids:
                    pids[pid] = _fresh_pid(pid, used)
                    used.add(pids[pid])
                if ev.get("ph") != "M":
                    active.add(pid)
                moved = _moved_fast(ev, shift) if shift is not None else None
                moved = moved if moved is not None else _moved(ev, move)
                if span is not None and not _inside(moved, span):
                    continue
                moved["pid"] = pids[pid]
                if moved.get("ph") == "M" and moved.get("name") == "process_name":
                    named.add(pid)
                    given = moved.get("args")
                    args = dict(given) if isinstance(given, dict) else {}
                    args["name"] = _process_name(inp.path, d, pid, args.get("name", pid))
                    moved["args"] = args
                kept.append(moved)
            out.add(kept)
            flows.see(kept)
            count += len(kept)
        extra = []
        for pid in pids:
            if pid not in named:
                label = _process_name(inp.path, d, pid, None)
                extra.append(
                    {"name": "process_name", "ph": "M", "pid": pids[pid], "tid": 0,
                     "args": {"name": label}}
                )  # fmt: skip
        if d is not None:
            info = d[0]
            order = _ROLE_ORDER.get(str(info.get("role")), 2) * 100000 + int(info.get("rank") or 0)
            extra += [
                {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                 "args": {"sort_index": order}}
                for pid in pids.values()
            ]  # fmt: skip
            entry = {k: info.get(k) for k in ("role", "rank", "host", "pid") if k in info}
            # The pid this rank's process has in the merged file, so that a
            # reader joins the entry to its events (trace.processes).
            own = info.get("pid")
            if own in active:
                entry["merged_pid"] = pids[own]
            elif len(active) == 1:  # its one process with events
                entry["merged_pid"] = pids[next(iter(active))]
            elif own in pids:
                entry["merged_pid"] = pids[own]
            ranks.append(
                entry
                # The clock as this merge applied it, derived again from the estimates.
                | {"clock": d[1].to_json(), "file": os.path.basename(inp.path)}
            )
        if not whole:
            out.add(extra)
            count += len(extra)
        if isinstance(out, _PerfettoOut):
            out.end_input()
        summary.append(
            {
                "path": inp.path,
                "pids": sorted(map(str, pids.values())),
                "shift_us": move(0) / 1000,
                "truncated": inp.truncated,
                "clock": d[1].to_json() if d is not None else None,
            }
        )
    return count, summary, ranks


def _inside(event: RawEvent, span: tuple[int, int]) -> bool:
    """Whether a moved event overlaps span (ns); events without a time always are."""
    times = span_ns(event.get("ts"), event.get("dur", 0))
    if times is None or event.get("ph") == "M":
        return True
    return times[0] <= span[1] and times[1] >= span[0]


def _window_ns(
    window: Window, inputs: list[_Input], moves: list[_Move], executor: Executor | None
) -> tuple[int, int]:
    """The window as ns on the merged axis; step numbers looked up in every input
    (on the executor: a task per input read from its file)."""
    kind, lo, hi = window
    if kind == "seconds":
        return round(lo * 1e9), round(hi * 1e9)
    found: dict[int, list[tuple[int, int]]] = {}
    if executor is not None:
        apart = [k for k, inp in enumerate(inputs) if inp.held is None]
        steps = executor.map(partial(_steps_of, lo=lo, hi=hi), [inputs[k].path for k in apart])
        found = dict(zip(apart, steps))
    first: int | None = None
    last: int | None = None
    for k, (inp, move) in enumerate(zip(inputs, moves)):
        spans = found[k] if k in found else _steps_in(inp, lo, hi)
        for start, end in ((move(a), move(b)) for a, b in spans):
            first = start if first is None else min(first, start)
            last = end if last is None else max(last, end)
    if first is None or last is None:
        raise TraceFormatError(f"merge: no step numbered {lo:g} to {hi:g} in the inputs")
    return first, last


def _steps_of(path: str, lo: float, hi: float) -> list[tuple[int, int]]:
    """The map of a step window: one input's steps numbered lo to hi, (start,
    end) ns on its own axis."""
    return _steps_in(_Input(path), lo, hi)


def _steps_in(inp: _Input, lo: float, hi: float) -> list[tuple[int, int]]:
    spans = []
    order: dict[tuple[Any, Any, str], int] = {}
    for block in inp.blocks():
        for ev in block:
            n = _step_number(ev, order)
            times = span_ns(ev.get("ts"), ev.get("dur", 0))
            if n is not None and lo <= n <= hi and times is not None:
                spans.append(times)
    return spans


def _near_events(
    inputs: list[_Input], moves: list[_Move], span: tuple[int, int], executor: Executor | None
) -> dict[int, list[RawEvent]]:
    """On the executor, by input index: the events of each input in mxprof's
    shape that may lie in the window (what ``_Input.blocks(near)`` gives),
    decoded there, one input a task; none without an executor."""
    if executor is None:
        return {}
    items: dict[int, tuple[str, tuple[float, float]]] = {}
    for k, (inp, move) in enumerate(zip(inputs, moves)):
        if inp.lines and inp.held is None and move.clock.constant:
            shift = move(0)
            items[k] = (inp.path, ((span[0] - shift) / 1000 - 1, (span[1] - shift) / 1000 + 1))
    return dict(zip(items, executor.map(_near_of, list(items.values()))))


def _near_of(item: tuple[str, tuple[float, float]]) -> list[RawEvent]:
    """The map of a window: one input's events that may overlap near (µs on its
    own axis), as dicts."""
    path, near = item
    return [e for block in _Input(path).blocks(near) for e in block]


def _step_number(event: RawEvent, order: dict[tuple[Any, Any, str], int]) -> int | None:
    """A complete range's step number (``steps.number``), None for other events."""
    if event.get("ph") != "X":
        return None
    name, category = str(event.get("name", "")), str(event.get("cat", ""))
    if not (is_frame(category) or is_profiler_step(name)):
        return None
    key = (event.get("pid"), event.get("tid"), name)
    n = order.get(key, 0)
    order[key] = n + 1
    return number(name, event.get("args"), n)

"""The readers on hostile and big gzip input: time and peak memory, .json.gz beside .json.

    python benchmarks/readers.py [--quick] [--sizes 16 64 256] [--events 2000000] [--member 16]
    python benchmarks/readers.py --formats 10000000 [--root DIR] [--before DIR] [--repeats 3]
    python benchmarks/readers.py --decode 10000000 [--repeats 3] [--root DIR]

Each input is written twice, as plain ``.json`` and as ``.json.gz`` (the
gzip one in members of ``--member`` MiB of text: the core writes a member per
flush, tens of MB for a busy run),
and each is read by ``mxprof.load(path).key_averages()`` in a process of its
own, so that the peak RSS is that reading's own:

- bombs of N MiB of text (``--sizes``): one event whose name is one huge
  string; newlines only;
- a trace of ``--events`` events in mxprof's one-event-per-line shape
  (written directly in the core's shape: recording millions of events with
  the live core takes longer than reading them).

Issue 27's targets, checked at the end: a ``.json.gz`` of N decompressed
bytes peaks at most 64 MB above the same ``.json``, and time grows linearly
with N (the 256 MiB bombs take at most 16 x the 16 MiB ones, plus 1 s).
``--formats N`` instead records N ranges of a training-like loop (a step
holding nine ops, on a frozen clock, so both files hold the same events) with
the live core as ``.json`` and as ``.pftrace``, and reads each the same way:
issue 26's target is that the ``.pftrace`` costs no more to read than the
``.json`` (time and peak memory).  ``--root DIR`` records and reads with the
mxprof tree at DIR (another checkout: its writer and its readers), for a
before/after comparison in the same run.  Each file is read ``--repeats``
times (medians; the readings of the two formats alternate), and with
``--before DIR`` also by the tree at DIR, alternating with root's, the files
being the same: the rows marked "before".

``--decode N`` records about N events with ``benchmarks/report.py``'s
training-like loop (the live core) and times, each in a process of its
own and alternating, ``--repeats`` times: a typed msgspec decode of the file
into ``Event`` objects (the floor for any reading of the JSON), and
``mxprof.load(path).key_averages()`` with the compiled reader
(``mxprof.trace._fastjson``) and without it (``MXPROF_PURE_READER=1``).
Issue 26's target: the compiled reading within 2 x the decode (medians).

``--quick`` is a small run that checks the script works, never how fast
anything is. Files go to a temporary folder.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20

READ = """
import resource, sys, time
import mxprof
from mxprof.errors import TraceFormatError
start = time.perf_counter()
try:
    rows = mxprof.load(sys.argv[1]).key_averages()
    outcome = f"{sum(r.count for r in rows)} ranges"
except TraceFormatError as e:
    outcome = "refused: " + str(e).split(": ", 1)[1][:40]
took = time.perf_counter() - start
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, outcome, sep="\\t")
"""


RECORD = """
import sys
import mxprof
from mxprof import _testing
from mxprof._native import lib
path, ranges = sys.argv[1], int(sys.argv[2])
d = mxprof.Domain("bench")
step = d.new_task("step")._id
ops = [d.new_task(f"op{k}")._id for k in range(9)]
begin, end = lib.mxp_range_begin, lib.mxp_range_end
with _testing.fake_clock(1_000_000_000) as advance:
    mxprof.set_config(filename=path, profile_api=False, max_events=0)
    mxprof.set_state("run")
    for _ in range(ranges // 10):
        begin(step)
        for k in ops:
            advance(3)
            begin(k)
            advance(1_000 + k)
            end(k)
        advance(5)
        end(step)
    mxprof.set_state("stop")
    mxprof.dump()
"""


READ_CPU = READ.replace("time.perf_counter()", "time.process_time()")

# --formats: wall and CPU seconds and peak RSS of one reading.
READ_TIMES = """
import resource, sys, time
import mxprof
start, cpu = time.perf_counter(), time.process_time()
rows = mxprof.load(sys.argv[1]).key_averages()
took, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(took, cpu, peak, f"{sum(r.count for r in rows)} ranges", sep="\t")
"""

# A typed decode of the whole file into Events: what any reading of the JSON costs at least.
DECODE = """
import resource, sys, time
import msgspec
from mxprof.trace._event import Event
class Doc(msgspec.Struct):
    traceEvents: list[Event]
start = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    n = len(msgspec.json.decode(f.read(), type=Doc).traceEvents)
took = time.perf_counter() - start
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, f"{n} events", sep="\\t")
"""

RECORD_TRAINING = """
import sys
sys.path.insert(0, sys.argv[3])
import report
report.record(sys.argv[1], int(sys.argv[2]))
"""


def decode(events: int, repeats: int, root: str, folder: str) -> dict[str, list[float]]:
    """Record about ``events`` events (report.py's loop), then time the typed
    decode and load().key_averages() with and without the compiled reader,
    alternating, ``repeats`` times each: the seconds of each, per way."""
    path = os.path.join(folder, "training.json")
    env = {**os.environ, "PYTHONPATH": root}
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, "-c", RECORD_TRAINING, path, str(events), here]
    subprocess.run(cmd, check=True, timeout=3600, env=env, cwd=folder)
    times: dict[str, list[float]] = {"msgspec decode": [], "compiled": [], "pure": []}
    for _ in range(repeats):
        for way, script, pure in (
            ("msgspec decode", DECODE, ""),
            ("compiled", READ, "0"),
            ("pure", READ, "1"),
        ):
            took, peak, outcome = read(path, root, script, {"MXPROF_PURE_READER": pure})
            print(f"  {way:<15} {took:7.2f} s  {peak / 1e6:6.0f} MB peak  {outcome}")
            sys.stdout.flush()
            times[way].append(took)
    print(f"({os.path.getsize(path) / 1e6:.0f} MB of JSON)")
    os.unlink(path)
    return times


def formats(
    ranges: int, root: str, folder: str, repeats: int = 1, before: str | None = None
) -> dict[str, tuple[float, float, int, str, int]]:
    """Record the same ranges as .json and .pftrace with the tree at root; read
    each ``repeats`` times with root's tree (and before's, alternating, where
    given): (median wall s, median CPU s, median peak RSS, outcome, bytes) per
    format and tree.  The CPU time is the steadier figure on a loaded machine."""
    paths = {}
    for ext in (".json", ".pftrace"):
        path = paths[ext] = os.path.join(folder, "loop" + ext)
        env = {**os.environ, "PYTHONPATH": root}
        cmd = [sys.executable, "-c", RECORD, path, str(ranges)]
        # cwd: python -c puts it first on sys.path, before PYTHONPATH (root).
        subprocess.run(cmd, check=True, timeout=3600, env=env, cwd=folder)
    trees = [("", root)] + ([(" before", before)] if before else [])
    seen: dict[str, list[tuple[float, float, int, str]]] = {}
    for _ in range(repeats):
        for ext, path in paths.items():
            for mark, tree in trees:
                seen.setdefault(ext + mark, []).append(read_times(path, tree))
                sys.stdout.flush()
    out = {}
    for label, runs in seen.items():
        path = paths[label.split(" ")[0]]
        out[label] = (
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
            int(statistics.median(r[2] for r in runs)),
            runs[-1][3],
            os.path.getsize(path),
        )
    for path in paths.values():
        os.unlink(path)
    return out


def read_times(path: str, root: str) -> tuple[float, float, int, str]:
    """One ``load(path).key_averages()`` by the tree at root, in a process of
    its own: (wall s, CPU s, peak RSS, outcome)."""
    proc = subprocess.run(
        [sys.executable, "-c", READ_TIMES, path],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": root},
        cwd=os.path.dirname(path),
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return float("nan"), float("nan"), 0, f"FAILED: {last[:60]}"
    took, cpu, peak, outcome = proc.stdout.strip().split("\t")
    return float(took), float(cpu), int(peak), outcome


def write_both(folder: str, name: str, pieces: object, member: int) -> tuple[str, str]:
    """The text from pieces (an iterable of bytes) as name.json and name.json.gz."""
    plain, packed = os.path.join(folder, name + ".json"), os.path.join(folder, name + ".json.gz")
    with open(plain, "wb") as p, open(packed, "wb") as g:
        pending = bytearray()
        for piece in pieces:  # type: ignore[attr-defined]
            p.write(piece)
            pending += piece
            if len(pending) >= member:
                g.write(gzip.compress(bytes(pending), 1))
                pending.clear()
        g.write(gzip.compress(bytes(pending), 1))
    return plain, packed


def string_bomb(size: int) -> object:
    yield b'{"traceEvents":[\n{"ph":"X","name":"'
    for _ in range(size // MIB):
        yield b"a" * MIB
    yield b'","ts":1,"dur":1,"pid":1,"tid":1}\n]}\n'


def newline_bomb(size: int) -> object:
    for _ in range(size // MIB):
        yield b"\n" * MIB


def real_trace(events: int) -> object:
    yield b'{"displayTimeUnit":"ms","baseTimeNanoseconds":1795000000000000000,"traceEvents":[\n'
    yield b'{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"python"}},\n'
    batch = []
    for i in range(events):
        batch.append(
            b'{"name":"op%d","cat":"user_annotation","ph":"X","ts":%d.125,"dur":0.75,'
            b'"pid":1,"tid":%d},\n' % (i % 98, i, 1 + i % 4)
        )
        if len(batch) == 10000:
            yield b"".join(batch)
            batch = []
    yield b"".join(batch)
    yield b'{"name":"end","ph":"i","s":"t","ts":0,"pid":1,"tid":1}\n],"otherData":{}}\n'


def read(
    path: str, root: str = ROOT, script: str = READ, env: dict[str, str] | None = None
) -> tuple[float, int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", script, path],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": root, **(env or {})},
        cwd=os.path.dirname(path),  # not a tree's root: python -c imports from its cwd first
    )
    if proc.returncode != 0:  # a raw traceback: what the targets rule out
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return float("nan"), 0, f"FAILED: {last[:60]}"
    took, peak, outcome = proc.stdout.strip().split("\t")
    return float(took), int(peak), outcome


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256], help="MiB of text")
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--member", type=int, default=16, help="MiB of text per gzip member")
    ap.add_argument("--formats", type=int, metavar="N", help="N ranges as .json and .pftrace")
    ap.add_argument("--root", default=ROOT, help="the mxprof tree to record and read with")
    ap.add_argument("--decode", type=int, metavar="N", help="N events: load vs a msgspec decode")
    ap.add_argument("--repeats", type=int, help="readings of each way (--decode: 3, --formats: 1)")
    ap.add_argument("--before", help="--formats: also read with the mxprof tree at BEFORE")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.events = [1, 2], 20_000
        args.decode = args.decode and 20_000
    folder = tempfile.mkdtemp(prefix="mxprof-bench-readers-")
    if args.repeats is None:
        args.repeats = 3 if args.decode else 1
    if args.decode:
        before = os.getloadavg()
        try:
            times = decode(args.decode, args.repeats, os.path.abspath(args.root), folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        after = os.getloadavg()
        median = {way: statistics.median(t) for way, t in times.items()}
        base = median["msgspec decode"]
        print(
            f"{args.decode:,} events, medians of {args.repeats} (load average {before[0]:.1f} "
            f"before, {after[0]:.1f} after, {os.cpu_count()} cpus):"
        )
        for way, m in median.items():
            print(f"  {way:<15} {m:7.2f} s  {m / base:5.2f} x the decode")
        fine = median["compiled"] <= 2 * base
        print(f"target: compiled load().key_averages() <= 2 x decode {'ok' if fine else 'MISSED'}")
        return 0 if fine or args.quick else 1
    if args.formats:
        try:
            before = args.before and os.path.abspath(args.before)
            got = formats(args.formats, os.path.abspath(args.root), folder, args.repeats, before)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        load = os.getloadavg()[0]
        print(f"{args.formats:,} ranges recorded and read with {args.root}; load {load:.1f}")
        if args.before:
            print(f"(before: read with {args.before}; medians of {args.repeats} readings)")
        print(f"{'format':<16} {'MB':>8} {'wall s':>8} {'CPU s':>8} {'peak MB':>8}  outcome")
        for ext, (took, cpu, peak, outcome, size) in got.items():
            print(
                f"{ext:<16} {size / 1e6:8.1f} {took:8.2f} {cpu:8.2f} {peak / 1e6:8.0f}  {outcome}"
            )
        pf, js = got[".pftrace"], got[".json"]
        fine = pf[1] <= js[1] and pf[2] <= js[2]
        print(
            f"target: .pftrace / .json = {pf[0] / js[0]:.2f} in wall time, {pf[1] / js[1]:.2f} "
            f"in CPU time, {pf[2] / js[2]:.2f} in peak memory (CPU and memory <= 1) "
            f"{'ok' if fine else 'MISSED'}"
        )
        return 0 if fine or args.quick else 1
    results: dict[tuple[str, int], dict[str, tuple[float, int, str]]] = {}
    try:
        inputs = [("string bomb", s, string_bomb(s * MIB)) for s in args.sizes]
        inputs += [("newlines", s, newline_bomb(s * MIB)) for s in args.sizes]
        inputs += [("trace", args.events, real_trace(args.events))]
        print(f"{'input':<12} {'size':>9} {'file':>8} {'s':>7} {'peak MB':>8}  outcome")
        for kind, size, pieces in inputs:
            name = f"{kind.replace(' ', '_')}_{size}"
            plain, packed = write_both(folder, name, pieces, args.member * MIB)
            got = results[(kind, size)] = {}
            for label, path in ((".json", plain), (".json.gz", packed)):
                took, peak, outcome = got[label] = read(path)
                shown = f"{size} MiB" if kind != "trace" else f"{size:,} ev"
                print(
                    f"{kind:<12} {shown:>9} {label:>8} {took:7.2f} {peak / 1e6:8.0f}  {outcome}"
                    f"  ({os.path.getsize(path) / 1e6:.1f} MB on disk)"
                )
                sys.stdout.flush()
            os.unlink(plain)
            os.unlink(packed)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ok = True
    for key, got in results.items():
        extra = (got[".json.gz"][1] - got[".json"][1]) / 1e6
        fine = extra <= 64
        ok &= fine
        print(
            f"target {key[0]} {key[1]}: .json.gz peak - .json peak = {extra:+.0f} MB (<= 64) "
            f"{'ok' if fine else 'MISSED'}"
        )
    for kind in ("string bomb", "newlines"):
        small, big = min(args.sizes), max(args.sizes)
        t_small = results[(kind, small)][".json.gz"][0]
        t_big = results[(kind, big)][".json.gz"][0]
        fine = t_big <= t_small * big / small + 1.0
        ok &= fine
        print(
            f"target {kind}: {big} MiB in {t_big:.2f} s, {small} MiB in {t_small:.2f} s: "
            f"linear {'ok' if fine else 'MISSED'}"
        )
    print(f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cpus)")
    return 0 if ok or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())

"""Workloads that clock themselves: the ground truth a stack sampler's shares are checked against.

    python truth.py WORKLOAD [--seconds S] [--burst-ms B] [--profiler mxprof|oracle|none]
                    [--rate HZ] [--mode wall|cpu] [--out trace.json] [--result result.json]
                    [--cycles N] [--work IPM:NPM] [--oracle-policy fifo|other]
                    [--oracle-timing jitter|fixed]

Each workload runs named functions on named threads and measures, with
``time.perf_counter`` (wall) and ``time.thread_time`` (CPU) read on entry and
exit, the seconds each function spent; that is the ground truth. Under
``--profiler mxprof`` it records itself (``set_config(filename=OUT,
sample_rate=HZ)``, plus ``sample_mode=MODE`` only when ``--mode`` is given)
and the result holds the shares read back from the trace too. Under
``--profiler oracle`` an ideal sampler (:class:`_Oracle`; wall mode
only) samples it instead: what it misses, the machine's timing alone
costs. Under ``--profiler none`` it runs bare: for a profiler outside the
process (py-spy), whose stacks :func:`shares` turns into the same figures
(the benchmark does that), or for timing the workload alone.

Definitions (one for every profiler):

- A *group* is the functions one thread runs, listed in the result under a
  label (``groups``). No function is in two groups and none calls another of
  its group, so a sample belongs to the group whose function is on its stack:
  the thread is known from the stack alone, and the tids of different
  profilers never need matching.
- A function's *share* within its group is the samples whose stack holds it
  (anywhere: inclusive) over the samples whose stack holds any function of the
  group, in percent. Samples with none of them (start-up, the driver's loop,
  the profiler's own threads, an idle event loop) count nowhere. In wall mode
  every sample counts, a blocked thread's too: a sample whose innermost frame
  is mxprof's ``<waiting>`` counts for the function that waits. In cpu mode a
  ``<waiting>`` sample counts nowhere.
- The *true share* is the function's measured seconds over the sum of its
  group's, in percent: wall seconds in wall mode, CPU seconds in cpu mode.
- The *error* of a group is the largest ``|share - true share|`` over its
  functions, in points.

Workloads (``--seconds`` long, or ``--cycles`` cycles where one is defined):

- ``mixed``: one thread cycling through ``py_cpu`` (pure Python for B ms),
  ``c_holds_gil`` (B ms in C with the GIL held) and ``sleeps``
  (``time.sleep(B / 1000)``).
- ``queue``: the main thread computes (``consume_compute``, 2 ms) then blocks
  in ``queue.Queue.get`` (``consume_get``) on a slower producer thread, which
  sleeps (``produce_sleep``, 3 ms) and computes (``produce_make``, 0.5 ms)
  per item.
- ``lock``: a holder thread takes a lock (``holder_acquire``), sleeps
  (``holder_sleep``, 1 ms) and computes (``holder_compute``, 2 ms) holding
  it, then sleeps without it (``holder_rest``, 1 ms); the main thread blocks
  on the same lock (``waiter_blocked``), computes under it (``waiter_work``,
  1 ms) and sleeps briefly after it (``waiter_rest``, 0.2 ms).
- ``threads``: four threads, each its own compute and sleep functions
  (``alpha_*`` 3 + 1 ms, ``beta_*`` 2 + 2, ``gamma_*`` 1 + 3, ``delta_*``
  0.5 + 3.5), competing for the GIL.
- ``asyncio``: three tasks on one loop, each computing inline between
  ``await asyncio.sleep`` (``task_a`` 2 ms then 1 ms asleep, ``task_b`` 1 + 2,
  ``task_c`` 0.5 + 0.5). A coroutine is on the thread's stack only while it
  runs, so its share is of the time the loop ran coroutines.
- ``short``: per step 120 calls of ``forward`` (250 us of pure Python each),
  one ``backward`` (30 ms) and ``load_batch`` (``time.sleep``, 15 ms).
- ``twophase``: ``with phase_a: only_in_a()`` then ``with phase_b:
  only_in_b()`` (mxprof Domain tasks; B ms each); the result counts the
  samples of each function attributed to the other phase's range or to none
  (``misattributed``; all must be 0).
- ``loop``: ``py_loop``, pure Python in bursts of B ms, for overhead.

The C code that holds the GIL is ``sum(range(n))``: a builtin whose loop over
a range iterator of small ints never calls back into Python, so it never
reaches the interpreter's check for a GIL drop request and holds the GIL
until it returns (hashlib and zlib, by contrast, release it for large
buffers). ``n`` is calibrated at start so that one call takes min(1, B) ms;
a burst is a few such calls, as a numeric library's small kernels would be.
Compute bursts run a fixed count of loop iterations, calibrated at start to
take the burst's length alone (``--work`` gives the calibration instead, so
that processes compared for overhead do the same work).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable

WAITING = "<waiting>"  # mxprof's last frame of a blocked thread
THIS_FILE = os.path.basename(__file__)

# name -> [wall seconds, CPU seconds, calls]; each name is written by one thread only.
TRUTH: dict[str, list[float]] = {}

_now = time.perf_counter
_cpu = time.thread_time


class _timed:
    """Adds the wall and CPU seconds of its block to TRUTH[name]; under the
    oracle, also shows the function in the thread's slot while it runs."""

    __slots__ = ("name", "wall", "cpu", "slot")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        if ORACLE.map is not None:
            self.slot = ORACLE.enter(self.name)
        self.wall = _now()
        self.cpu = _cpu()

    def __exit__(self, *exc: object) -> None:
        cpu = _cpu() - self.cpu  # first: a preemption at its syscall belongs inside
        wall = _now() - self.wall
        if ORACLE.map is not None:
            ORACLE.map[self.slot] = 0
        t = TRUTH.setdefault(self.name, [0.0, 0.0, 0])
        t[0] += wall
        t[1] += cpu
        t[2] += 1


class _Oracle:
    """The ideal sampler (``--profiler oracle``): every timed block writes its
    function's number into its thread's byte of a shared map, and a process
    of its own (``_oracle_sampler``) reads the bytes HZ times a second on
    average, with SCHED_FIFO priority where permitted, so that the OS runs it
    on time, and each interval drawn from 0.5 to 1.5 periods, so that it
    cannot lock in step with a workload that wakes on timers too. It reads no
    stacks, so what it misses is what the machine's timing costs a sampler
    that does both. ``--oracle-policy other`` (the default priority) and
    ``--oracle-timing fixed`` (a fixed period, as mxprof and py-spy sample)
    show what each costs."""

    SIZE = 4096  # 64 thread slots; at the end, the ready and stop bytes
    READY, STOP = SIZE - 2, SIZE - 1

    def __init__(self) -> None:
        self.map: Any = None
        self.ids: dict[str, int] = {}
        self.slots: dict[int, int] = {}

    def enter(self, name: str) -> int:
        fid = self.ids.get(name)
        if fid is None:
            fid = self.ids[name] = len(self.ids) + 1
        me = threading.get_ident()
        slot = self.slots.get(me)
        if slot is None:
            slot = self.slots[me] = len(self.slots)
        self.map[slot] = fid
        return slot

    def start(self, rate: float, policy: str, jitter: str) -> tuple[Any, str]:
        import mmap

        fd, path = tempfile.mkstemp(suffix=".oracle")
        os.write(fd, bytes(self.SIZE))
        self.map = mmap.mmap(fd, self.SIZE)
        os.close(fd)
        cmd = [sys.executable, __file__, "oracle-sampler", path, str(rate), policy, jitter]
        proc = subprocess.Popen(cmd)
        while not self.map[self.READY] and proc.poll() is None:
            time.sleep(0.001)
        return proc, path

    def stop(self, proc: Any, path: str) -> tuple[list[tuple[list[str], int]], str]:
        self.map[self.STOP] = 1
        proc.wait(timeout=60)
        with open(path + ".json", encoding="utf-8") as f:
            got = json.load(f)
        os.remove(path + ".json")
        os.remove(path)
        names = {v: k for k, v in self.ids.items()}
        return [([names[int(k)]], n) for k, n in got["counts"].items()], got["policy"]


ORACLE = _Oracle()


def _oracle_sampler(path: str, rate: float, policy: str, jitter: bool) -> None:
    """The oracle's sampling process: counts of each function number seen."""
    import mmap
    import random

    if policy == "fifo":
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except (OSError, AttributeError):
            policy = "other (SCHED_FIFO refused)"
    fd = os.open(path, os.O_RDWR)
    view = mmap.mmap(fd, _Oracle.SIZE)
    counts: dict[int, int] = {}
    period, due = 1.0 / rate, _now()
    view[_Oracle.READY] = 1
    while not view[_Oracle.STOP]:
        due += period * (random.uniform(0.5, 1.5) if jitter else 1.0)
        delay = due - _now()
        if delay > 0:
            time.sleep(delay)
        else:
            due = _now()  # fell behind: skip the samples missed, as mxprof does
        for fid in view[:64]:
            if fid:
                counts[fid] = counts.get(fid, 0) + 1
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump({"counts": counts, "policy": policy}, f)


# ---- the work itself (helpers: never named in a group) ----


def _python_work(n: int) -> int:
    x = 0
    for i in range(n):
        x += i & 7
    return x


class Calibration:
    """Loop iterations per ms of pure Python, range length per ms of sum()."""

    def __init__(self, ipm: float, npm: float) -> None:
        self.ipm, self.npm = ipm, npm

    @classmethod
    def measure(cls) -> Calibration:
        def per_ms(fn: Callable[[int], object], n: int) -> float:
            fn(n)
            times = []
            for _ in range(7):
                t = _now()
                fn(n)
                times.append(_now() - t)
            return n / (statistics.median(times) * 1000)

        return cls(per_ms(_python_work, 100_000), per_ms(lambda n: sum(range(n)), 200_000))

    @classmethod
    def parse(cls, text: str) -> Calibration:
        ipm, npm = text.split(":")
        return cls(float(ipm), float(npm))

    def text(self) -> str:
        return f"{self.ipm:.1f}:{self.npm:.1f}"

    def python(self, ms: float) -> None:
        _python_work(max(1, round(ms * self.ipm)))

    def c_call(self, ms: float) -> None:
        """ms of C holding the GIL: calls of min(1, ms) ms each."""
        each = min(1.0, ms)
        n = max(1, round(each * self.npm))
        for _ in range(max(1, round(ms / each))):
            sum(range(n))


class Run:
    """What a workload is given: options, calibration, ranges, when to stop."""

    def __init__(self, args: argparse.Namespace, cal: Calibration, ranges: Any) -> None:
        self.burst = args.burst_ms
        self.cal = cal
        self.cycles = args.cycles
        self.deadline = _now() + args.seconds
        self.ranges = ranges  # (phase_a, phase_b): mxprof Tasks, or null contexts

    def more(self, done: int) -> bool:
        if self.cycles is not None:
            return done < self.cycles
        return _now() < self.deadline


Groups = dict[str, list[str]]


# ---- mixed, loop ----


def py_cpu(run: Run) -> None:
    with _timed("py_cpu"):
        run.cal.python(run.burst)


def c_holds_gil(run: Run) -> None:
    with _timed("c_holds_gil"):
        run.cal.c_call(run.burst)


def sleeps(run: Run) -> None:
    with _timed("sleeps"):
        time.sleep(run.burst / 1000)


def mixed(run: Run) -> Groups:
    done = 0
    while run.more(done):
        py_cpu(run)
        c_holds_gil(run)
        sleeps(run)
        done += 1
    return {"main": ["py_cpu", "c_holds_gil", "sleeps"]}


def py_loop(run: Run) -> None:
    with _timed("py_loop"):
        run.cal.python(run.burst)


def loop(run: Run) -> Groups:
    done = 0
    while run.more(done):
        py_loop(run)
        done += 1
    return {"main": ["py_loop"]}


# ---- queue ----


def consume_compute(run: Run) -> None:
    with _timed("consume_compute"):
        run.cal.python(2.0)


def consume_get(q: queue.Queue[object]) -> object:
    with _timed("consume_get"):
        return q.get()


def produce_sleep() -> None:
    with _timed("produce_sleep"):
        time.sleep(0.003)


def produce_make(run: Run) -> int:
    with _timed("produce_make"):
        run.cal.python(0.5)
        return 1


def queue_(run: Run) -> Groups:
    q: queue.Queue[object] = queue.Queue()

    def producer() -> None:
        done = 0
        while run.more(done):
            produce_sleep()
            q.put(produce_make(run))
            done += 1
        q.put(None)

    t = threading.Thread(target=producer, name="producer")
    t.start()
    while True:
        consume_compute(run)
        if consume_get(q) is None:
            break
    t.join()
    return {
        "consumer": ["consume_compute", "consume_get"],
        "producer": ["produce_sleep", "produce_make"],
    }


# ---- lock ----


def holder_acquire(lock: threading.Lock) -> None:
    with _timed("holder_acquire"):
        lock.acquire()


def holder_sleep() -> None:
    with _timed("holder_sleep"):
        time.sleep(0.001)


def holder_compute(run: Run) -> None:
    with _timed("holder_compute"):
        run.cal.python(2.0)


def holder_rest() -> None:
    with _timed("holder_rest"):
        time.sleep(0.001)


def waiter_blocked(lock: threading.Lock) -> None:
    with _timed("waiter_blocked"):
        lock.acquire()


def waiter_work(run: Run) -> None:
    with _timed("waiter_work"):
        run.cal.python(1.0)


def waiter_rest() -> None:
    with _timed("waiter_rest"):
        time.sleep(0.0002)


def lock(run: Run) -> Groups:
    # The holder sleeps first with the lock held, so that the waiter (which
    # needs the GIL to get there) is already blocked in acquire() when the
    # holder computes; and it rests after releasing, else it would take the
    # lock back at once (a Lock is not fair) and starve the waiter.
    the_lock = threading.Lock()
    stop = threading.Event()

    def holder() -> None:
        done = 0
        while run.more(done):
            holder_acquire(the_lock)
            try:
                holder_sleep()
                holder_compute(run)
            finally:
                the_lock.release()
            holder_rest()
            done += 1
        stop.set()

    t = threading.Thread(target=holder, name="holder")
    t.start()
    while not stop.is_set():
        waiter_blocked(the_lock)
        try:
            waiter_work(run)
        finally:
            the_lock.release()
        waiter_rest()
    t.join()
    return {
        "holder": ["holder_acquire", "holder_sleep", "holder_compute", "holder_rest"],
        "waiter": ["waiter_blocked", "waiter_work", "waiter_rest"],
    }


# ---- threads ----


def alpha_compute(run: Run) -> None:
    with _timed("alpha_compute"):
        run.cal.python(3.0)


def alpha_sleep() -> None:
    with _timed("alpha_sleep"):
        time.sleep(0.001)


def beta_compute(run: Run) -> None:
    with _timed("beta_compute"):
        run.cal.python(2.0)


def beta_sleep() -> None:
    with _timed("beta_sleep"):
        time.sleep(0.002)


def gamma_compute(run: Run) -> None:
    with _timed("gamma_compute"):
        run.cal.python(1.0)


def gamma_sleep() -> None:
    with _timed("gamma_sleep"):
        time.sleep(0.003)


def delta_compute(run: Run) -> None:
    with _timed("delta_compute"):
        run.cal.python(0.5)


def delta_sleep() -> None:
    with _timed("delta_sleep"):
        time.sleep(0.0035)


def threads(run: Run) -> Groups:
    pairs = {
        "alpha": (alpha_compute, alpha_sleep),
        "beta": (beta_compute, beta_sleep),
        "gamma": (gamma_compute, gamma_sleep),
        "delta": (delta_compute, delta_sleep),
    }

    def worker(compute: Callable[[Run], None], sleep: Callable[[], None]) -> None:
        done = 0
        while run.more(done):
            compute(run)
            sleep()
            done += 1

    workers = [threading.Thread(target=worker, args=p, name=n) for n, p in pairs.items()]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return {n: [c.__name__, s.__name__] for n, (c, s) in pairs.items()}


# ---- asyncio ----


async def task_a(run: Run) -> None:
    done = 0
    while run.more(done):
        with _timed("task_a"):
            run.cal.python(2.0)
        await asyncio.sleep(0.001)
        done += 1


async def task_b(run: Run) -> None:
    done = 0
    while run.more(done):
        with _timed("task_b"):
            run.cal.python(1.0)
        await asyncio.sleep(0.002)
        done += 1


async def task_c(run: Run) -> None:
    done = 0
    while run.more(done):
        with _timed("task_c"):
            run.cal.python(0.5)
        await asyncio.sleep(0.0005)
        done += 1


def asyncio_(run: Run) -> Groups:
    async def main() -> None:
        await asyncio.gather(task_a(run), task_b(run), task_c(run))

    asyncio.run(main())
    return {"loop": ["task_a", "task_b", "task_c"]}


# ---- short ----


def forward(run: Run) -> None:
    with _timed("forward"):
        run.cal.python(0.25)


def backward(run: Run) -> None:
    with _timed("backward"):
        run.cal.python(30.0)


def load_batch() -> None:
    with _timed("load_batch"):
        time.sleep(0.015)


def short(run: Run) -> Groups:
    done = 0
    while run.more(done):
        for _ in range(120):
            forward(run)
        backward(run)
        load_batch()
        done += 1
    return {"main": ["forward", "backward", "load_batch"]}


# ---- twophase ----


def only_in_a(run: Run) -> None:
    with _timed("only_in_a"):
        run.cal.python(run.burst)


def only_in_b(run: Run) -> None:
    with _timed("only_in_b"):
        run.cal.python(run.burst)


def twophase(run: Run) -> Groups:
    phase_a, phase_b = run.ranges
    done = 0
    while run.more(done):
        with phase_a:
            only_in_a(run)
        with phase_b:
            only_in_b(run)
        done += 1
    return {"main": ["only_in_a", "only_in_b"]}


# The range each twophase function runs in (category, name).
PHASES = {"only_in_a": ("truth", "phase_a"), "only_in_b": ("truth", "phase_b")}

WORKLOADS: dict[str, Callable[[Run], Groups]] = {
    "mixed": mixed,
    "queue": queue_,
    "lock": lock,
    "threads": threads,
    "asyncio": asyncio_,
    "short": short,
    "twophase": twophase,
    "loop": loop,
}


# ---- shares ----


def shares(
    groups: Groups, stacks: Iterable[tuple[Iterable[str], int]], mode: str = "wall"
) -> dict[str, Any]:
    """Samples and shares per group, from (function names on the stack, samples).

    The names are those of the stack's frames in this file, plus ``WAITING``
    where the sample's innermost frame is mxprof's ``<waiting>``.

    Example:
        >>> s = shares({"main": ["f", "g"]}, [(["f"], 3), (["g", WAITING], 1), ([], 5)])
        >>> s["samples"], s["shares"]
        ({'main': 4}, {'main': {'f': 75.0, 'g': 25.0}})
    """
    counts = {g: dict.fromkeys(fns, 0) for g, fns in groups.items()}
    totals = dict.fromkeys(groups, 0)
    owner = {fn: g for g, fns in groups.items() for fn in fns}
    for names, n in stacks:
        names = set(names)
        if mode == "cpu" and WAITING in names:
            continue
        hit = {owner[fn] for fn in names if fn in owner}
        for g in hit:
            totals[g] += n
        for fn in names:
            if fn in owner:
                counts[owner[fn]][fn] += n
    out = {
        g: {fn: round(100.0 * c / totals[g], 2) if totals[g] else 0.0 for fn, c in fns.items()}
        for g, fns in counts.items()
    }
    return {"samples": totals, "counts": counts, "shares": out}


def true_shares(groups: Groups, truth: dict[str, list[float]], mode: str = "wall") -> dict:
    """The true share of each function within its group, in percent."""
    col = 1 if mode == "cpu" else 0
    out: dict[str, dict[str, float]] = {}
    for g, fns in groups.items():
        secs = {fn: truth.get(fn, [0.0, 0.0, 0])[col] for fn in fns}
        total = sum(secs.values())
        out[g] = {fn: round(100.0 * s / total, 2) if total else 0.0 for fn, s in secs.items()}
    return out


def errors(measured: dict[str, dict[str, float]], truth: dict[str, dict[str, float]]) -> dict:
    """Per group, the largest |share - true share| in points."""
    return {g: round(max(abs(measured[g][fn] - truth[g][fn]) for fn in truth[g]), 2) for g in truth}


def mxprof_stacks(path: str) -> tuple[list[tuple[list[str], int]], dict[str, int]]:
    """A trace's samples as shares() takes them, and the twophase misattributions.

    ``misattributed`` counts, per twophase function, its samples attributed to
    a range other than its own phase: ``only_in_b in phase_a`` and so on, and
    ``... in no range``.
    """
    import mxprof

    stacks: list[tuple[list[str], int]] = []
    wrong: dict[str, int] = {}
    for s in mxprof.load(path).samples.samples:
        names = [f[0] for f in s.stack if os.path.basename(f[1]) == THIS_FILE]
        if s.stack and s.stack[-1][0] == WAITING:
            names.append(WAITING)
        stacks.append((names, 1))
        for fn, home in PHASES.items():
            if fn in names and s.range != home:
                where = s.range[1] if s.range else "no range"
                key = f"{fn} in {where}"
                wrong[key] = wrong.get(key, 0) + 1
    return stacks, wrong


def pyspy_stacks(path: str) -> list[tuple[list[str], int]]:
    """py-spy's raw (folded) output as shares() takes it: one line per stack,
    ``frame;frame;... count``, a frame ``function (file:line)``; with ``-t`` the
    first frame names the thread. py-spy has no waiting frame."""
    stacks = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            folded, _, count = line.rstrip("\n").rpartition(" ")
            if not folded or not count.isdigit():
                continue
            names = []
            for frame in folded.split(";"):
                function, sep, where = frame.rpartition(" (")
                if sep and os.path.basename(where.rsplit(":", 1)[0]) == THIS_FILE:
                    names.append(function)
            stacks.append((names, int(count)))
    return stacks


# ---- the driver ----


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("workload", choices=sorted(WORKLOADS))
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--cycles", type=int, help="run this many cycles instead of --seconds")
    p.add_argument("--burst-ms", type=float, default=None, help="mixed 3, twophase 0.5, loop 3")
    p.add_argument("--profiler", choices=("mxprof", "oracle", "none"), default="none")
    p.add_argument("--oracle-policy", choices=("fifo", "other"), default="fifo")
    p.add_argument("--oracle-timing", choices=("jitter", "fixed"), default="jitter")
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--mode", choices=("wall", "cpu"), help="passed to mxprof only when given")
    p.add_argument("--out", help="mxprof's trace (default: a temporary file)")
    p.add_argument("--result", help="where the result JSON goes (default: stdout)")
    p.add_argument("--work", help="IPM:NPM, a calibration to use instead of measuring one")
    args = p.parse_args(argv)
    if args.burst_ms is None:
        args.burst_ms = 0.5 if args.workload == "twophase" else 3.0
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["oracle-sampler"]:
        _oracle_sampler(argv[1], float(argv[2]), argv[3], argv[4] == "jitter")
        return
    args = parse(argv)
    mode = args.mode or "wall"
    cal = Calibration.parse(args.work) if args.work else Calibration.measure()
    ranges: Any = (contextlib.nullcontext(), contextlib.nullcontext())
    out, tmp = args.out, None
    if args.profiler == "mxprof":
        import mxprof

        if out is None:
            tmp = tempfile.mkdtemp()
            out = os.path.join(tmp, "trace.json")
        config: dict[str, Any] = {"filename": out, "sample_rate": args.rate}
        if args.mode:
            config["sample_mode"] = args.mode  # a key of the new sampler
        mxprof.set_config(**config)
        domain = mxprof.Domain("truth")
        ranges = (domain.new_task("phase_a"), domain.new_task("phase_b"))
        mxprof.set_state("run")
    elif args.profiler == "oracle":
        oracle = ORACLE.start(args.rate, args.oracle_policy, args.oracle_timing)
    run = Run(args, cal, ranges)
    start = _now()
    groups = WORKLOADS[args.workload](run)
    elapsed = _now() - start
    result: dict[str, Any] = {
        "workload": args.workload,
        "burst_ms": args.burst_ms,
        "profiler": args.profiler,
        "rate": args.rate if args.profiler != "none" else None,
        "mode": mode,
        "python": sys.version.split()[0],
        "work": cal.text(),
        "elapsed": elapsed,
        "groups": groups,
        "truth": {fn: {"wall": t[0], "cpu": t[1], "calls": t[2]} for fn, t in TRUTH.items()},
        "true_shares": true_shares(groups, TRUTH, mode),
    }
    stacks = None
    if args.profiler == "mxprof":
        mxprof.set_state("stop")  # joins the sampler
        mxprof.dump()
        stacks, wrong = mxprof_stacks(out)
        if args.workload == "twophase":
            result["misattributed"] = wrong
        if tmp is not None:
            os.remove(out)
            os.rmdir(tmp)
    elif args.profiler == "oracle":
        stacks, result["oracle_policy"] = ORACLE.stop(*oracle)
    if stacks is not None:
        got = shares(groups, stacks, mode)
        result.update(got)
        result["total_samples"] = sum(n for _, n in stacks)
        result["errors"] = errors(got["shares"], result["true_shares"])
    text = json.dumps(result, indent=1)
    if args.result:
        with open(args.result, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()

"""Analyses of many files: a pure function per file (map), a merge of what it
returns (reduce), on a pluggable executor.

An analysis of a job (``mxprof stats`` or ``mxprof ranks`` of one file per
rank) splits into a function of one path that loads its file and returns a
small partial result, and a reduce that merges the partials in the inputs'
order.  Only paths go to the workers and only partials come back: a trace
is never pickled between processes.  The executors:

- ``Local(jobs)``: this process and ``jobs - 1`` processes started with
  ``spawn`` (safe whatever threads the caller runs; a forked copy of a
  process holding locks is not), one file a task, the largest first;
  ``jobs=1``, one file, or the default (the cores) for inputs under
  ``SPAWN_MIN_BYTES`` in all run in this process alone;
- ``Dask(address)``: the workers of a running Dask scheduler
  (``dask://HOST:PORT``, which must answer within ``CONNECT_TIMEOUT_S``),
  or of a ``LocalCluster`` started for the call (``dask``).  The workers
  must import the same mxprof and read the same paths (a shared
  filesystem).

A partial holds what its reduce needs exactly (for statistics: per name
count, totals, ends and the sorted durations), so results are the same
whatever the executor and however many workers: the map is pure and the
reduce sees the partials in the inputs' order.

Example:
    >>> from mxprof.trace.engine import executor, key_averages
    >>> with executor(jobs=2) as ex:  # doctest: +SKIP
    ...     rows = key_averages(["rank0.json", "rank1.json"], ex)
"""

from __future__ import annotations

import collections
import functools
import os
import re
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from ..averages import KeyAverages, Partial, Run, combine, tally
from ..errors import ConfigError
from .model import load

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DASK_EXTRA",
    "Dask",
    "Executor",
    "Local",
    "SPAWN_MIN_BYTES",
    "StatsPart",
    "default_jobs",
    "executor",
    "key_averages",
    "parse_engine",
    "stats_part",
]

A = TypeVar("A")
T = TypeVar("T")

CONNECT_TIMEOUT_S = 10.0  # a scheduler that has not answered by then is not there
DASK_EXTRA = 'pip install "mxprof[dask]"'
# Starting a spawned process (an interpreter importing mxprof) costs about what
# reading 30 MB of trace does: below this, the default (--jobs not given) reads
# in this process; a number of jobs asked for is always used.
SPAWN_MIN_BYTES = 32 << 20
_ADDRESS = re.compile(r"dask://([^:/\s]+|\[[0-9a-fA-F:]+\]):(\d{1,5})")


def default_jobs() -> int:
    """The cores this process may run on (the default of ``--jobs``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Executor:
    """Runs a pure function of a path over paths; results in the paths' order."""

    name = "executor"

    def map(self, fn: Callable[[A], T], paths: Sequence[A]) -> list[T]:
        """fn(path) for every path, in order; the first input's failure (in the
        paths' order) raised here as it was raised there.  A path may come
        with arguments of its own: an item is a path or a tuple whose first
        member is one.

        Example:
            >>> Local(1).map(len, ["a", "bc"])
            [1, 2]
        """
        outcomes = self._run(functools.partial(_outcome, fn), list(paths))
        for failed, value in outcomes:
            if failed:
                raise value
        return [value for _, value in outcomes]

    def _run(
        self, task: Callable[[Any], tuple[bool, Any]], paths: list[Any]
    ) -> list[tuple[bool, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        """Free the workers (a started cluster stops)."""


class Local(Executor):
    """This process and ``jobs - 1`` spawned ones, or this process alone for one
    job or one file."""

    def __init__(self, jobs: int | None = None) -> None:
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise ConfigError(f"jobs must be an integer >= 1, got {jobs!r}")
        self.chosen = jobs is not None
        self.jobs = default_jobs() if jobs is None else jobs
        self.name = f"local, {self.jobs} process{'es' if self.jobs > 1 else ''}"

    def _run(
        self, task: Callable[[Any], tuple[bool, Any]], paths: list[Any]
    ) -> list[tuple[bool, Any]]:
        workers = min(self.jobs, len(paths))
        if workers <= 1 or (not self.chosen and _size(paths) < SPAWN_MIN_BYTES):
            return [task(p) for p in paths]
        # Imported here: multiprocessing registers exit hooks, which a command
        # that reads in this process must not leave behind (tests/test_offline.py).
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

        # This process is one of the ``jobs``: it has mxprof imported already
        # and would otherwise only wait, so it spawns one process fewer (one
        # interpreter's start and imports less) and reads files itself while
        # the children start.  Largest files first (a child's queue takes
        # from the front, this process from the back): the last tasks left
        # are the small ones, so neither side waits long for the other.
        order = sorted(range(len(paths)), key=lambda k: -_size(paths[k : k + 1]))
        todo = collections.deque(order)
        done: dict[int, tuple[bool, Any]] = {}
        running: dict[Future[tuple[bool, Any]], int] = {}
        context = multiprocessing.get_context("spawn")
        children = workers - 1
        with ProcessPoolExecutor(max_workers=children, mp_context=context) as pool:
            while todo or running:
                # Each child one task ahead: it never waits for this process
                # to come back from a file of its own to hand it the next.
                while todo and len(running) < 2 * children:
                    k = todo.popleft()
                    running[pool.submit(task, paths[k])] = k
                if todo:
                    k = todo.pop()
                    done[k] = task(paths[k])
                else:
                    wait(running, return_when=FIRST_COMPLETED)
                for future in [f for f in running if f.done()]:
                    done[running.pop(future)] = future.result()
        return [done[k] for k in range(len(paths))]


class Dask(Executor):
    """The workers of a Dask scheduler at ``address`` (``HOST:PORT``), or of a
    LocalCluster of ``jobs`` single-threaded worker processes (address None).

    Raises:
        ConfigError: Dask is not installed (the line names the extra), or no
            scheduler answers at the address within ``timeout`` seconds.
    """

    def __init__(
        self,
        address: str | None = None,
        jobs: int | None = None,
        timeout: float | None = None,
    ) -> None:
        timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
        try:
            import distributed
        except ImportError:
            raise ConfigError(f"the dask engine needs Dask: {DASK_EXTRA}") from None
        dask: Any = distributed  # untyped: its calls are checked by the tests
        self.cluster: Any = None
        if address is None:
            workers = default_jobs() if jobs is None else jobs
            with _forkserver():
                self.cluster = dask.LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",  # workers and scheduler reachable from this machine only
                    dashboard_address=None,
                    # No dashboard; its HTTP server on any free port (not 8787: no warning
                    # when another cluster has it).
                    scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                    silence_logs=40,  # logging.ERROR: the cluster's own chatter stays off stderr
                )
            self.client: Any = dask.Client(self.cluster, timeout=timeout)
            self.name = f"dask, LocalCluster of {workers} workers"
            return
        try:
            self.client = dask.Client(f"tcp://{address}", timeout=timeout)
        except (OSError, TimeoutError) as e:
            raise ConfigError(
                f"no Dask scheduler answers at {address} (waited {timeout:g} s): {e}"
            ) from None
        self.name = f"dask, scheduler at {address}"

    def _run(
        self, task: Callable[[Any], tuple[bool, Any]], paths: list[Any]
    ) -> list[tuple[bool, Any]]:
        import distributed

        as_completed: Any = distributed.as_completed  # untyped
        # Largest files first, as Local does: the scheduler hands out the
        # highest priority first, so the last tasks left are the small ones
        # and no worker waits long for another at the end.  pure=False: a
        # path's file may have changed between two calls.
        futures = {
            self.client.submit(task, path, pure=False, priority=_size([path])): k
            for k, path in enumerate(paths)
        }
        # Each result fetched as it is ready (not all at the end, when the
        # workers would have nothing left to do but send) and released on
        # its worker at once.
        done: dict[int, tuple[bool, Any]] = {}
        for future, outcome in as_completed(futures, with_results=True):
            done[futures.pop(future)] = outcome
        return [done[k] for k in range(len(paths))]

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
            _stop_forkserver()


@contextmanager
def _forkserver() -> Iterator[None]:
    """A LocalCluster's worker processes forked from a fork server, where there
    is one (Linux, macOS), instead of spawned.

    Spawned, each worker is a new interpreter that imports Dask (about a
    second of CPU each, at the start of every ``--engine dask`` command); the
    fork server imports it once and forks the workers from its own single
    thread, so they are as safe as spawned ones whatever threads this
    process runs.  Measured: a LocalCluster of 2 up, used and closed in
    4.1 s instead of 6.3 s (docs/scaling.md).
    """
    import multiprocessing

    import dask

    # Dask's workers return freed memory to the system from 64 KiB on
    # (MALLOC_TRIM_THRESHOLD_, against fragmentation in long-lived workers):
    # for a command's short-lived workers, which allocate and free a file's
    # columns in turn, that costs 25-35 % more CPU per file; glibc's default
    # is kept instead.
    environ = {
        k: v
        for k, v in dask.config.get("distributed.nanny.pre-spawn-environ", {}).items()
        if k != "MALLOC_TRIM_THRESHOLD_"
    }
    settings: dict[str, Any] = {
        "distributed.nanny.pre-spawn-environ": environ,
        # Nor does a worker sample its own stacks every 10 ms (the dashboard's
        # profile, which nobody sees here): each sample takes the GIL from the
        # task.
        "distributed.worker.profile.enabled": False,
    }
    if "forkserver" in multiprocessing.get_all_start_methods():
        settings["distributed.worker.multiprocessing-method"] = "forkserver"
    with dask.config.set(settings):
        yield


def _stop_forkserver() -> None:
    """Stop the fork server a LocalCluster started (``_forkserver``) and wait
    for it: no process of ours outlives the command's executor, and the CPU
    time of the server and of the workers it forked is this process's
    children's (a benchmark's ``RUSAGE_CHILDREN`` sees it).  Another use of
    the fork server in this process starts a new one.  multiprocessing has
    no public call for it; where its private one is missing, the server
    stays until this process exits, as it would anyway.
    """
    from multiprocessing import forkserver

    stop = getattr(getattr(forkserver, "_forkserver", None), "_stop", None)
    if callable(stop):
        stop()


def _size(items: list[Any]) -> int:
    """The inputs' bytes (a path that cannot be read counts 0: its map says why)."""
    total = 0
    for item in items:
        path = item[0] if isinstance(item, tuple) and item else item
        with suppress(OSError, TypeError):
            total += os.path.getsize(path)
    return total


def _outcome(fn: Callable[[A], T], path: A) -> tuple[bool, Any]:
    """(False, fn(path)), or (True, the exception it raised): a bad input is a
    value sent back, not a worker's failure (which Dask would log as a crash)."""
    try:
        return False, fn(path)
    except Exception as e:
        return True, e


def parse_engine(text: str) -> str | None:
    """``--engine``'s value checked: "local", "dask" or "dask://HOST:PORT".

    Returns:
        None for the local processes, "" for a LocalCluster, else HOST:PORT.

    Raises:
        ConfigError: anything else.

    Example:
        >>> parse_engine("local"), parse_engine("dask"), parse_engine("dask://10.0.0.1:8786")
        (None, '', '10.0.0.1:8786')
    """
    if text == "local":
        return None
    if text == "dask":
        return ""
    m = _ADDRESS.fullmatch(text)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ConfigError(f"engine {text!r}: give local, dask, or dask://HOST:PORT")
    return f"{m.group(1)}:{m.group(2)}"


@contextmanager
def executor(jobs: int | None = None, engine: str = "local") -> Iterator[Executor]:
    """The executor ``--jobs``/``--engine`` name, closed on leaving.

    Args:
        jobs: processes (local) or LocalCluster workers (``dask``); default
            the cores.  Not used with a scheduler's address.
        engine: ``parse_engine``'s forms.

    Example:
        >>> with executor(jobs=1) as ex:
        ...     ex.map(len, ["a", "bc"])
        [1, 2]
    """
    address = parse_engine(engine)
    ex: Executor = Local(jobs) if address is None else Dask(address or None, jobs)
    try:
        yield ex
    finally:
        ex.close()


# ---- statistics of many files ----


@dataclass(frozen=True)
class StatsPart:
    """What ``stats_part`` returns of one file: its path, whether it was cut
    short, its events' count and its per-name partial statistics."""

    path: str
    truncated: bool
    events: int
    partial: Partial

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (to go back from a worker) with its durations tallied where
        they repeat (``averages.tally``): a file of 1 M ranges sends about
        0.4 MB instead of 7.5 MB, which Dask's TCP transfer costs about
        4 ms of CPU a MB on each side."""
        groups = {key: (own, tally(run)) for key, (own, run) in self.partial.groups.items()}
        return (StatsPart, (self.path, self.truncated, self.events, Partial(groups)))


def stats_part(path: str) -> StatsPart:
    """The map of ``mxprof stats``: one file's per-name statistics, mergeable.

    Pure (the file in, a value out) and importable by name, so that spawned
    processes and Dask workers can run it.
    """
    trace = load(path)
    durations = trace.durations()
    groups: dict[tuple[str, str], tuple[int, Run]] = {}
    for r in trace.key_averages():
        key = (r.name, r.category)
        ordered = durations[key]
        try:
            packed: Sequence[int] = array("q", ordered)
        except OverflowError:  # past int64 ns (a damaged file): kept as a list
            packed = ordered
        groups[key] = (int(r.self), packed)
    return StatsPart(path, trace.truncated, len(trace), Partial(groups))


def key_averages(paths: Sequence[str], ex: Executor) -> tuple[KeyAverages, list[StatsPart]]:
    """Per-name statistics of every file together, and each file's part.

    The rows are those ``load(...).key_averages()`` gives of the files merged
    into one (the same nearest-rank percentiles, exactly).

    Example:
        >>> with executor(jobs=2) as ex:  # doctest: +SKIP
        ...     rows, parts = key_averages(["r0.json", "r1.json"], ex)
    """
    parts = ex.map(stats_part, list(paths))
    return combine([p.partial for p in parts]), parts

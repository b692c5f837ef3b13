"""Typed configuration: MXNet's ``set_config`` keys plus mxprof's own.

``Config`` declares every key once (type, default, checker, doc) and is
frozen: the session holds one and replaces it whole on each change, and
readers use attributes (``SESSION.config.filename``).  Every key is
validated before anything is applied, so a call with one bad value changes
nothing.  Keys not passed keep their current values (MXNet reset them to
defaults on every call).
"""

from __future__ import annotations

import math
import os
import signal
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Literal

from . import _native
from .errors import ConfigError


@dataclass(frozen=True)
class Key:
    """One configuration key: its default, its checker, and what it does."""

    name: str
    default: Any
    check: Callable[[str, Any], Any]
    doc: str


def check_bool(key: str, value: Any) -> bool:
    """True/False/1/0 as a bool, else ConfigError naming key."""
    # MXNet's parameter parser took True/False/1/0; so do we, and nothing else.
    if value is True or value is False:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{key} must be a bool (True, False, 1 or 0), got {value!r}")


# The core's limits.  The background writer waits in int64 nanoseconds
# (mxp_flush_wait), so a period must be at least 1 ns and at most 2**63 - 1
# ns; counts go to uint64 parameters (mxp_max_events_set,
# mxp_flush_threshold_set), and the threshold is rounded up to whole chunks of
# records, which would wrap near 2**64: int64's range keeps both exact.
MIN_PERIOD = 1e-9
MAX_PERIOD = (2**63 - 1) // 10**9  # 9223372036 s, about 292 years
MAX_COUNT = 2**63 - 1


def _path(key: str, value: Any) -> str:
    """A non-empty str (or os.PathLike of one) that can name a file: no NUL,
    and valid Unicode, so that it encodes to UTF-8 for the core and the OS."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ConfigError(
            f"{key} must be a path (str or os.PathLike), got {type(value).__name__} {value!r}"
        )
    if not value:
        raise ConfigError(f"{key} must not be empty, got {value!r}")
    if "\0" in value:
        raise ConfigError(f"{key} must not contain NUL characters, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"{key} {value!r} is not valid Unicode text ({e.reason}): a path must encode to UTF-8"
        ) from None
    return str(value)


def _filename(key: str, value: Any) -> str:
    path = _path(key, value)
    if _native.trace_format(path.encode("utf-8")) < 0:
        raise ConfigError(
            f"{key} {path!r}: gzip output needs zlib, and this build of mxprof has none "
            "(reinstall it where zlib's header, zlib.h, is present)"
        )
    return path


def _period(key: str, value: Any) -> float:
    allowed = f"a finite number of seconds from {MIN_PERIOD:g} to {MAX_PERIOD}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be {allowed}, got {type(value).__name__} {value!r}")
    # An int is compared as it is: one beyond float's range cannot be converted.
    if isinstance(value, int):
        ok = 0 < value <= MAX_PERIOD
    else:
        ok = math.isfinite(value) and MIN_PERIOD <= value <= MAX_PERIOD
    if not ok:
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")
    return float(value)


def _count(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ConfigError(f"{key} must be an int from 0 to {MAX_COUNT}, got {value!r}")
    return int(value)


MAX_SAMPLE_RATE = 20_000  # Hz; mxprof._sampler.MAX_RATE says why


def _rate(key: str, value: Any) -> float:
    allowed = f"a number of samples per second from 0 (off) to {MAX_SAMPLE_RATE}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be {allowed}, got {type(value).__name__} {value!r}")
    if not (0 <= value <= MAX_SAMPLE_RATE):  # NaN fails this too
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")
    return float(value)


SAMPLE_MODES = ("wall", "cpu")


def _mode(key: str, value: Any) -> str:
    if not isinstance(value, str) or value not in SAMPLE_MODES:
        raise ConfigError(f"{key} must be 'wall' or 'cpu', got {value!r}")
    return str(value)


PROCESSES = ("worker", "server")


def _process(key: str, value: Any) -> str:
    if not isinstance(value, str) or value not in PROCESSES:
        raise ConfigError(f"{key} must be 'worker' or 'server', got {value!r}")
    return str(value)


MAX_WINDOW = 86_400.0  # s: a flight recorder's window (one day)
MIN_RING_BYTES = 1 << 20
MAX_RING_BYTES = 1 << 40


def _window(key: str, value: Any) -> float:
    allowed = f"a number of seconds from 0 (off) to {MAX_WINDOW:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be {allowed}, got {type(value).__name__} {value!r}")
    if not (0 <= value <= MAX_WINDOW):  # NaN fails this too
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")
    return float(value)


def _ring_bytes(key: str, value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_RING_BYTES <= value <= MAX_RING_BYTES
    ):
        raise ConfigError(
            f"{key} must be an int number of bytes from {MIN_RING_BYTES} (1 MiB) to "
            f"{MAX_RING_BYTES} (1 TiB), got {value!r}"
        )
    return int(value)


def _signal(key: str, value: Any) -> str:
    """A signal that can be caught, by name ('SIGUSR2', 'USR2') or number, as
    its name; None or '' (off) as ''."""
    if value is None or value == "":
        return ""
    sig: signal.Signals | None = None
    if isinstance(value, str):
        name = value.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        sig = getattr(signal.Signals, name, None) if not name.startswith("SIG_") else None
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            sig = signal.Signals(value)
        except ValueError:
            sig = None
    if sig is None or sig in _UNCATCHABLE:
        raise ConfigError(
            f"{key} must be the name or number of a signal that can be caught (such as "
            f"'SIGUSR2'), or None or '' for none, got {value!r}"
        )
    return sig.name


_UNCATCHABLE = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}
MAX_SLOW_FACTOR = 1e6
MAX_STEPS = 100_000


def _factor(key: str, value: Any) -> float:
    allowed = f"0 (off) or a number from 1 to {MAX_SLOW_FACTOR:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be {allowed}, got {type(value).__name__} {value!r}")
    if not (value == 0 or 1 <= value <= MAX_SLOW_FACTOR):  # NaN fails this too
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")
    return float(value)


def _steps(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STEPS:
        raise ConfigError(
            f"{key} must be an int number of steps from 1 to {MAX_STEPS}, got {value!r}"
        )
    return int(value)


MIN_LEAK_STEPS = 6  # fewer steps say nothing about persistence (trace.leak.MIN_WINDOW)
MAX_LEAK_STEPS = 1000  # the rule's cost grows as the square of its window
MAX_SITES_STEPS = 1000


def _leak_steps(key: str, value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_LEAK_STEPS <= value <= MAX_LEAK_STEPS
    ):
        raise ConfigError(
            f"{key} must be an int number of steps from {MIN_LEAK_STEPS} to {MAX_LEAK_STEPS}, "
            f"got {value!r}"
        )
    return int(value)


def _sites_steps(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SITES_STEPS:
        raise ConfigError(
            f"{key} must be an int number of steps from 0 (off) to {MAX_SITES_STEPS}, got {value!r}"
        )
    return int(value)


def _bytes(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ConfigError(
            f"{key} must be an int number of bytes from 0 (off) to {MAX_COUNT}, got {value!r}"
        )
    return int(value)


Source = Literal["profile_symbolic", "profile_imperative", "profile_memory", "profile_api"]


def _key(default: Any, check: Callable[[str, Any], Any], doc: str) -> Any:
    """A Config field: its default, the checker set_config runs, and what it does."""
    return field(default=default, metadata={"check": check, "doc": doc})


@dataclass(frozen=True)
class Config:
    """One configuration: a typed, read-only attribute per ``set_config`` key.

    The single place where keys are declared: ``KEYS`` (name, default,
    checker, doc) is read from these fields.  A change makes a new Config
    (``with_``, after ``validate``), and the session swaps it whole, so a
    reader holding one never sees it change.

    Example:
        >>> Config().filename
        'profile.json'
        >>> Config().with_(filename="run.json").filename
        'run.json'
    """

    filename: str = _key(
        "profile.json",
        _filename,
        "the trace file: Chrome JSON, gzip-compressed when it ends in .gz, Perfetto "
        "protobuf when it ends in .perfetto-trace or .pftrace",
    )
    profile_all: bool = _key(
        False,
        check_bool,
        "turns on every profile_* source, and statistics: a call with profile_all=True "
        "that does not name aggregate_stats also sets aggregate_stats=True (MXNet's did "
        "not, so its typical flow printed an empty dumps()); aggregate_stats named in the "
        "same call or a later one wins",
    )
    profile_symbolic: bool = _key(
        True,
        check_bool,
        "graph-mode sources of framework integrations (none in this release)",
    )
    profile_imperative: bool = _key(
        True,
        check_bool,
        "eager-mode sources: the PyTorch adapter (mxprof.integrations.torch)",
    )
    profile_memory: bool = _key(
        True,
        check_bool,
        "memory sources: mxprof.memory, mxprof.cuda's allocations, the torch adapter's "
        "CUDA memory; recorded while the state is 'run'",
    )
    profile_api: bool = _key(
        True,
        check_bool,
        "mxprof's own work: each trace write is a task 'flush' in domain 'mxprof'",
    )
    continuous_dump: bool = _key(
        True,
        check_bool,
        "write the trace in the background every dump_period",
    )
    dump_period: float = _key(
        1.0,
        _period,
        "seconds between background writes (from 1e-09 to 9223372036: the core waits "
        "in int64 nanoseconds)",
    )
    dump_events: int = _key(
        1_000_000,
        _count,
        "mxprof: also write in the background as soon as this many events wait in "
        "memory, so memory stays flat in long, busy runs (0: only every dump_period; "
        "at most 2**63 - 1)",
    )
    aggregate_stats: bool = _key(
        False,
        check_bool,
        "keep per-name statistics for dumps() (profile_all=True turns it on too); while "
        "it is off, dumps() returns '' and warns once",
    )
    profile_process: str = _key(
        "worker",
        _process,
        "'server' applies the call to every server of a distributed job instead "
        "(on the rank-0 worker, after mxprof.distributed.init)",
    )
    gpu_memory_profile_filename_prefix: str = _key(
        "gpu_memory_profile",
        _path,
        "prefix of the GPU memory CSV <prefix>-pid_<pid>.csv that dump() writes when "
        "GPU allocations were recorded",
    )
    max_events: int = _key(
        10_000_000,
        _count,
        "mxprof: most events held in memory awaiting the trace file; more are dropped "
        "and counted (0 = no limit; at most 2**63 - 1)",
    )
    follow_children: bool = _key(
        False,
        check_bool,
        "mxprof: child processes (fork, multiprocessing, Python subprocesses) profile "
        "too, each into <stem>.<pid><ext> next to the trace file",
    )
    flush_on_signal: bool = _key(
        True,
        check_bool,
        "mxprof: on SIGTERM/SIGINT write the trace, then let the signal act as before "
        "(installed from the main thread when a profile begins)",
    )
    memory_events: bool = _key(
        False,
        check_bool,
        "mxprof: with profile_memory, also an instant event per allocation and free "
        "in the trace (device, attribute, bytes in args)",
    )
    write_trace: bool = _key(
        True,
        check_bool,
        "mxprof: False records statistics only (no per-event records, no trace file); "
        "takes effect when a profile begins",
    )
    nvtx: bool = _key(
        False,
        check_bool,
        "mxprof: also emit every recorded range and marker as NVTX (push/pop ranges in a "
        "domain per mxprof domain; start/end ranges for asyncio tasks), seen by Nsight "
        "Systems or any tool named by NVTX_INJECTION64_PATH; a no-op without one",
    )
    control: bool = _key(
        True,
        check_bool,
        "mxprof: a local control endpoint for `mxprof ctl` (a Unix socket only this user "
        "can reach, served by a thread of its own); False closes it, True opens it again; "
        "the environment's MXPROF_CONTROL=0 keeps it closed whatever this says",
    )

    sample_rate: float = _key(
        0.0,
        _rate,
        "mxprof: Python stacks of every thread sampled this many times a second and "
        "attributed to the innermost open range (0 = off; at most 20000): in the trace, "
        "dumps()'s Samples section and the report",
    )
    sample_mode: str = _key(
        "wall",
        _mode,
        "mxprof: what samples count: 'wall' (every thread at every instant; one blocked "
        "then is sampled as <waiting> under the function that waits, so shares are of "
        "elapsed time) or 'cpu' (only threads on a CPU at the instant: shares of CPU time)",
    )

    flight_recorder: float = _key(
        0.0,
        _window,
        "mxprof: a flight recorder: keep only the last this many seconds of everything "
        "recorded in memory and write nothing until mxprof.trigger() or a trigger key "
        "asks for a snapshot (0 = off: the trace file as usual; at most 86400); takes "
        "effect when a profile begins",
    )
    flight_recorder_after: float = _key(
        0.0,
        _window,
        "mxprof: a snapshot also holds this many seconds after its trigger, and is "
        "written when they have passed (or at exit)",
    )
    flight_recorder_bytes: int = _key(
        256 << 20,
        _ring_bytes,
        "mxprof: the most memory the flight recorder's events may take (24 bytes each); "
        "when a window's events need more, the oldest go, and snapshots say how much "
        "shorter their window is",
    )
    flight_recorder_interval: float = _key(
        10.0,
        _window,
        "mxprof: at most one snapshot per this many seconds; triggers in between are "
        "counted, and named in the next snapshot (0 = no limit)",
    )
    flight_recorder_max: int = _key(
        20,
        _count,
        "mxprof: at most this many snapshot files per profile; later triggers are counted only",
    )

    trigger_exception: bool = _key(
        True,
        check_bool,
        "mxprof: with a flight recorder, an uncaught exception in any thread takes a "
        "snapshot (reason 'exception'; sys.excepthook and threading.excepthook are "
        "chained, the hooks in place still run)",
    )
    trigger_signal: str = _key(
        "SIGUSR2",
        _signal,
        "mxprof: with a flight recorder, this signal (a name or number; None or '' = "
        "none) takes a snapshot (reason 'signal'); not installed where the program "
        "handles it already (with a warning), and only from the main thread",
    )
    trigger_slow_step: float = _key(
        0.0,
        _factor,
        "mxprof: with a flight recorder, a step (a Frame) that lasts more than this many "
        "times the median of the last trigger_slow_step_steps steps of its frame takes "
        "a snapshot (reason 'slow step'; 0 = off, else at least 1)",
    )
    trigger_slow_step_steps: int = _key(
        20,
        _steps,
        "mxprof: how many steps of a frame the median of trigger_slow_step is taken over; "
        "no step is slow before that many have ended",
    )
    trigger_memory: int = _key(
        0,
        _bytes,
        "mxprof: with a flight recorder, a scope's memory in use (mxprof.memory, "
        "per scope) rising above this many bytes takes a snapshot (reason "
        "'memory'), once per crossing (0 = off; checked every 0.1 s)",
    )
    trigger_rss: int = _key(
        0,
        _bytes,
        "mxprof: with a flight recorder, the process's resident memory rising above this "
        "many bytes takes a snapshot (reason 'memory'), once per crossing (0 = off; "
        "checked every 0.1 s; Linux)",
    )
    watchdog: float = _key(
        0.0,
        _window,
        "mxprof: with a flight recorder, no step (Frame) ending for this many seconds "
        "while recording takes a snapshot (reason 'hang') with every thread's Python "
        "stack, and prints one line naming the stuck thread on stderr (0 = off)",
    )

    memory_steps: bool = _key(
        False,
        check_bool,
        "mxprof: sample this process's memory at every step (Frame) end and every "
        "memory_period seconds: counters rss, pss, uss, shared and cuda:N allocated/reserved "
        "in domain 'Process Memory', and the leak rule over them (docs/memory.md); "
        "followed children sample their own",
    )
    memory_period: float = _key(
        1.0,
        _window,
        "mxprof: with memory_steps, seconds between two samples of /proc/self/smaps_rollup "
        "(pss, uss, shared; rss too) taken off the program's threads (0 = none: step ends "
        "only; looked at every 0.1 s)",
    )
    leak_steps: int = _key(
        16,
        _leak_steps,
        "mxprof: the leak rule's window: growth over this many steps (samples, in a "
        "process without steps) by a robust slope, persistent over both halves",
    )
    leak_min_bytes: int = _key(
        256 << 10,
        _bytes,
        "mxprof: the least growth per step that the leak rule reports (bytes)",
    )
    leak_sites_steps: int = _key(
        4,
        _sites_steps,
        "mxprof: once a leak is flagged, trace Python allocations (tracemalloc) for this "
        "many steps and record the top growing sites as counters in 'Allocation Sites' "
        "(bytes per step; 0 = off)",
    )
    trigger_leak: bool = _key(
        True,
        check_bool,
        "mxprof: with a flight recorder and memory_steps, a leak flagged by the leak rule "
        "takes a snapshot (reason 'leak')",
    )

    def with_(self, **changes: Any) -> Config:
        """A copy with changes applied; they must be validated (``validate``) already."""
        return replace(self, **changes)

    def enabled(self, source: Source) -> bool:
        """Whether a profile_* source is on (profile_all turns every one on).

        Example:
            >>> Config(profile_all=True, profile_memory=False).enabled("profile_memory")
            True
        """
        return self.profile_all or bool(getattr(self, source))

    def as_dict(self) -> dict[str, Any]:
        """Every key and its value (e.g. to hand to a child process as JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


KEYS: dict[str, Key] = {
    f.name: Key(f.name, f.default, f.metadata["check"], f.metadata["doc"]) for f in fields(Config)
}


def validate(updates: dict[str, Any]) -> dict[str, Any]:
    """Check every key and value; return the normalised values to apply.

    ``profile_all=True`` brings ``aggregate_stats=True`` with it unless
    updates names ``aggregate_stats`` (DESIGN.md §3: the typical flow
    ``set_config(profile_all=True)`` ... ``print(dumps())`` prints a table).
    It is a value applied like any other, once: a later call's
    ``aggregate_stats=False`` turns statistics off, and ``profile_all=False``
    leaves them as they are.

    Raises ConfigError naming the first unknown key (with the list of valid
    ones) or bad value.
    """
    unknown = sorted(k for k in updates if k not in KEYS)
    if unknown:
        raise ConfigError(
            f"unknown config key {unknown[0]!r}; valid keys: {', '.join(sorted(KEYS))}"
        )
    values = {k: KEYS[k].check(k, v) for k, v in updates.items()}
    if values.get("profile_all") and "aggregate_stats" not in values:
        values["aggregate_stats"] = True
    return values

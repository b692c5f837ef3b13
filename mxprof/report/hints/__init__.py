"""Optimisation hints: rules over loaded traces, each with its evidence.

``find_hints(traces)`` looks at one or more loaded traces (several files, or
one merged file with several processes) and returns what a reader should look
at first: each ``Hint`` has a title, the numbers behind it (evidence lines
naming the ranges, steps, processes involved) and a concrete suggestion.
``Hint.to_dict`` and ``to_json`` give them as data (``mxprof hints
--format json``).

What the rules read is one model of the job (``mxprof.trace.processes``):

- *process*: one pid of one input, labelled ``worker 1`` / ``server 0``
  from structured metadata (a rank's ``distributedInfo``, a merged file's
  ``distributedInfo.ranks``), else ``pid N`` (with the file's name when
  several files are given);
- *steps*: the ranges of one frame or torch.profiler's ``ProfilerStep#N``,
  the group with the most ranges; *step time* is the span from the first
  step's start to the last one's end, so the time between steps (often where
  a loop fetches its next batch) is in it; *outlier steps* by the one rule of
  ``trace.processes``, the one the page's step chart uses; *time in no range*
  per step, as there;
- *wall time* of a process: its first event's start to its last one's end;
- *samples*: the stack samples of the trace (``Trace.samples``);
- *words* of a name: its parts split at non-letters and camelCase humps,
  lower-cased, plus each two neighbours joined (``DataLoader.__next__`` has
  ``data``, ``loader``, ``next``, ``dataloader``, ``loadernext``).

The rules (one module per family: ``loading``, ``steps``, ``memory``,
``ranks``, ``health``), their thresholds (module constants there) and why;
a rule gives at most one hint, covering every process where it fires:

=====================  ============================================  ==========================
rule                   fires when                                    why this threshold
=====================  ============================================  ==========================
data-loading           the loop waits for input >= 20 % of step      a fifth of the step spent
                       time (without steps: of wall time), found by  waiting for input is worth
                       loading ranges on the waiting thread, by the  overlapping; 20 samples
                       main thread's stack samples in a queue/pipe/  keep the share off noise
                       DataLoader wait (>= 20 samples), or by its
                       time in no range while another thread is
                       loading (``loading``); high >= 40 %
dataloader-stage       torch DataLoader waits (``instrument_-       the input rule's share;
                       dataloader``) >= 20 % of step time; names     workers busy 80 % of the
                       the stage: getitem or collate when workers    time have no slack left
                       are busy >= 80 % of the waits (too few when
                       ceil(batch / step) > num_workers), pin when
                       pinning a batch outlasts a step, else
                       prefetch too small (``dataloader``)
step-variance          >= 5 steps and CV of step durations >= 0.25,  CV 0.25 is far above the
                       or an outlier step (``trace.processes``:      few % of a steady loop;
                       longer than median + max(3 x 1.4826 x MAD,    3 scaled MADs is the usual
                       0.2 x median)); high from CV 0.5 or           robust fence, and 1.2 x
                       outliers' excess >= 20 % of all step time,    median keeps it off jitter
                       medium from CV 0.25 or 5 %, else low (and     when MAD is ~0
                       low when only the first step stands out:
                       warm-up)
tail-latency           a range name with >= 100 ranges, P99 >=       with 100 ranges P99 is not
                       5 x P50 and P99 >= 50 us; medium from 10 x,   the single slowest; 5 x is
                       else low                                      a tail, not jitter; 50 us
                                                                     skips timer noise
instrumentation-       in a trace mxprof wrote: names whose median   at 0.21 us a range, a
overhead               range is <= 10 us, their count x 0.21 us      range of 10 us pays 2 %;
                       >= 2 % of wall time and >= 1 ms; high from    2 % of the run (and 1 ms)
                       10 %                                          is worth a change
memory-peak            a device's memory counter (``Memory: gpu/0``  a peak is always worth
                       in ``Device Storage``) ever above 0; low      knowing, never alarming
memory-growth          >= 6 steps, a device's bytes in use at step   one rule for a leak,
                       ends grow by trace.leak's rule (as memory-    whatever counter shows
                       leak; window leak_steps, or every step of a   it; a warm-up that stops
                       shorter run); medium                          is not one
memory-leak            ``memory_steps``' counters (``Process         trace.leak's rule, the
                       Memory``): rss / cuda:N allocated at step     one the live sampler runs:
                       ends (uss per sample without steps) grow      a slope robust to spikes,
                       >= leak_min_bytes (256 KiB) per step over     growth in both halves so
                       leak_steps (16) by a Theil-Sen slope, in      warm-up that stops and one
                       both halves, above the noise; high            jump stay silent
straggler              the cross-rank analysis (``report.ranks``)    its thresholds are
                       names the rank the others wait for in         ``report.ranks``'s; 20 %
                       collectives (high when they wait >= 20 % of   of a step (or busy time)
                       a step); without collectives: >= 2            is beyond run-to-run
                       processes of one role (with steps, if any     noise of a balanced job
                       has them), the busiest's busy time (per step
                       with steps) >= 1.2 x the median of the
                       others; high from 1.5 x
dropped-events         ``otherData.dropped_events`` > 0; high        any loss makes the rest
                                                                     of the profile partial
misuse                 a tally of ``otherData`` (``TALLY_FIXES``)    each one names a fix;
                       > 0, medium for unmatched/non-LIFO stops,     calls while paused or
                       unknown frees, saturated values; low for      between scheduled cycles
                       cut ranges; ignored_calls alone does not      are expected
                       fire
idle-gap               on a thread with ranges, a gap with none      a tenth of the run
                       open between two ranges >= max(1 ms,          unaccounted for is worth a
                       10 % of wall time), or >= 1 s; medium when    look; 1 s is long anywhere
                       a thread's gaps add up to >= 25 % of wall
flight-recorder        the input is a flight recorder snapshot       says why the file exists;
                       (``otherData.flight_recorder``): its trigger  a rank in another range
                       and window; high when a rank of a job's       than the others in a hang
                       snapshot is in another range than most        is the one they wait for
                       others (``stuck``), medium when processes
                       are missing, else low
=====================  ============================================  ==========================

Loading ranges: a range (not a step, not containing one) whose name has one
of ``LOADING_WORDS``, or ``batch``/``batches`` with one of ``BATCH_VERBS``
(``get_batch``, ``next_batch``; not ``train_batch``), or ``data`` without
``parallel``; a user marks ranges as loading by putting them in a domain
(category) with such a word or ``input`` (``mxprof.Domain("input")``).

Straggler: where collectives were recorded (the torch adapter's, or
torch.profiler's ``gloo:``/``nccl:`` ranges), ``mxprof.report.ranks`` decides:
a slow rank waits *least* inside them, so it is found by whom the others
wait for, not by busy time, and no busy-time hint is given when the
collectives name no one.

Busy time (straggler, without collectives): on the steps' thread (without
steps, the thread with the most time in ranges), the time inside ranges
less the time inside ranges named like communication or waiting
(``COMM_WORDS``: ``allreduce``, ``barrier``, ``wait`` ...), within the step
span: so a fast rank that waits for a slow one in a collective is not
counted busy while it waits.

The per-range cost, ``RANGE_COST_NS`` = 210 ns, is ``with task`` while
recording from ``benchmarks/calls.py`` in the recorded run of
``benchmarks/README.md`` (2026-11-21, 209.6 ns; 160 ns on 2026-11-23 on the
same kind of 2-vCPU machine): the report runs without the compiled core, so
the cost is a constant of this build, the higher of the two.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ...trace import Trace
from ...trace.leak import PROCESS_MEMORY
from ...trace.processes import job
from ._common import SEVERITY_RANK, Hint, Job, Rule
from .dataloader import dataloader_stage
from .health import RANGE_COST_NS, dropped, misuse, overhead, tail_latency
from .loading import data_loading
from .memory import memory_growth, memory_leak, memory_peak
from .ranks import straggler
from .snapshot import snapshot
from .steps import idle_gaps, step_variance

__all__ = ["RANGE_COST_NS", "RULES", "Hint", "find_hints", "not_checked", "to_json"]

# In the order of the table above: ties of severity keep it.
RULES: tuple[tuple[str, Rule], ...] = (
    ("data-loading", data_loading),
    ("dataloader-stage", dataloader_stage),
    ("step-variance", step_variance),
    ("tail-latency", tail_latency),
    ("instrumentation-overhead", overhead),
    ("memory-peak", memory_peak),
    ("memory-growth", memory_growth),
    ("memory-leak", memory_leak),
    ("straggler", straggler),
    ("dropped-events", dropped),
    ("misuse", misuse),
    ("idle-gap", idle_gaps),
    ("flight-recorder", snapshot),
)


def find_hints(traces: Trace | Sequence[Trace]) -> list[Hint]:
    """Run every rule over the traces; the hints that fire, most severe first
    (ties in the order of the module docstring's table).

    Args:
        traces: loaded traces (``mxprof.load``); several files of one job are
            compared as processes (ranks). A single Trace is taken as [trace].

    Raises:
        TypeError: an item is not a Trace.

    Example:
        >>> import mxprof
        >>> from mxprof.report.hints import find_hints
        >>> ranks = [mxprof.load(f"rank{r}.json") for r in range(4)]  # doctest: +SKIP
        >>> found = find_hints(ranks)  # doctest: +SKIP
        >>> found[0].title  # doctest: +SKIP
        'Straggler: worker 1 is busy 1.31 x as long as the median of the others'
    """
    items = [traces] if isinstance(traces, Trace) else list(traces)
    for t in items:
        if not isinstance(t, Trace):
            raise TypeError(f"find_hints takes loaded Traces (mxprof.load), got {t!r}")
    context = Job(items, job(items))
    found = [rule(context) for _, rule in RULES]
    hints = [h for h in found if h is not None]
    hints.sort(key=lambda h: SEVERITY_RANK[h.severity])
    return hints


def not_checked(traces: Trace | Sequence[Trace]) -> list[str]:
    """What the inputs lack for some rules, each line naming what could not be
    checked, so that "no hints" is never read as "nothing to find".

    Example:
        >>> from mxprof.trace import Trace
        >>> not_checked(Trace([]))[0]
        'no ranges: no rule about time could look at the run'
    """
    items = [traces] if isinstance(traces, Trace) else list(traces)
    procs = job(items)
    out = []
    if not any(p.threads for p in procs):
        out.append("no ranges: no rule about time could look at the run")
    elif not any(p.steps for p in procs):
        out.append(
            "no steps (a frame or ProfilerStep#N): step variance and memory growth not "
            "checked; the input rule measured against wall time"
        )
    if not any(len(t.samples) for t in items):
        out.append(
            "no stack samples: waits outside ranges judged by time in no range alone "
            "(record with sample_rate, on in mxprof run)"
        )
    if sum(1 for p in procs if p.threads) < 2:
        out.append("one process with ranges: no straggler to compare")
    if not any(p.memory for p in procs):
        out.append("no memory counters (profile_memory): memory-peak and memory-growth not run")
    if not any(cat == PROCESS_MEMORY for p in procs for cat, _ in p.counters):
        out.append("no process memory samples (memory_steps): memory-leak not run")
    return out


def to_json(hints: Sequence[Hint]) -> str:
    """The hints as a JSON array of objects (``Hint.to_dict``), most severe first.

    Example:
        >>> to_json([])
        '[]'
    """
    return json.dumps([h.to_dict() for h in hints], indent=2 if hints else None)

"""The hint that the input is a flight recorder snapshot: why it was written,
where each rank was, and which one stands out."""

from __future__ import annotations

from ...trace.snapshot import trigger_of
from ._common import Hint, Job, capped, hint


def snapshot(job: Job) -> Hint | None:
    """The first snapshot among the inputs (``trace.snapshot``): high when a
    rank stands out (in a hang, the one not where the others wait), medium
    when processes are missing from a job's snapshot, low otherwise."""
    for trace in job.traces:
        t = trigger_of(trace)
        if t is None:
            continue
        kind = "job-wide flight recorder snapshot" if t.job else "flight recorder snapshot"
        by = f" on {t.by}" if t.by else ""
        evidence = [f"triggered{by} at {t.at_ns / 1e9:.3f} s of the file's time axis"]
        if t.window_seconds is not None:
            cut = ", shortened by the byte cap" if t.shortened_by_cap else ""
            evidence.append(f"window: {t.window_seconds:g} s before the trigger{cut}")
        evidence += [f"stands out: {line}" for line in t.stuck]
        evidence += capped([f"missing: {m}" for m in t.missing])
        severity = "high" if t.stuck else "medium" if t.missing else "low"
        if t.stuck:
            suggestion = (
                "look at what the standing-out process was doing in its last seconds (its "
                "range, the trigger's details: stacks, innermost ranges); the others wait for it"
            )
        else:
            suggestion = (
                "look at the last seconds before the trigger (the dashed line in `mxprof "
                "report`; the ranges still open there are cut short)"
            )
        subjects = [s.split(" is in ")[0] for s in t.stuck]
        return hint(
            "flight-recorder",
            severity,
            f"This is a {kind} of {t.reason!r}",
            evidence,
            suggestion,
            subjects,
        )
    return None

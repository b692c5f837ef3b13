"""What the sampling tests share: a body that spins, recording a trace with
samples, the samples' block of dumps(), and where a trace's samples landed."""

import collections
import json
import time

import mxprof
from mxprof import _sampler


def spin(seconds):
    """Pure Python for seconds: the function a sample should find running."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def record(path, body, rate=1000, mode="wall", kind=None):
    """Run body while recording to path with samples at rate in mode, and write
    the trace; returns path.  kind: the sampler that must be the one running
    ('native' or 'python'; None: either)."""
    mxprof.set_config(filename=str(path), aggregate_stats=True, sample_rate=rate, sample_mode=mode)
    mxprof.set_state("run")
    try:
        if kind is not None:
            assert _sampler.kind() == kind
        body()
    finally:
        mxprof.set_state("stop")  # joins the sampler: its counts are final
    mxprof.dump()
    return path


def dumps_samples():
    """dumps()'s Samples block without its settings (Rate, Mode), to compare
    with a loaded trace's summary."""
    block = json.loads(mxprof.dumps(format="json"))["Samples"]
    block.pop("Rate")
    block.pop("Mode")
    return block


def names(sample):
    """The functions on a sample's stack, outermost first, by their own name
    (a qualified name's last part: a test's local functions are qualified)."""
    return [f[0].rsplit(".", 1)[-1] for f in sample.stack]


def placed(trace, functions):
    """Where the samples of each function landed: a Counter of (function,
    range name or None, whether the sample is <waiting>), for samples whose
    stack holds the function."""
    where = collections.Counter()
    for s in trace.samples.samples:
        fns = names(s)
        for fn in functions:
            if fn in fns:
                where[(fn, s.range[1] if s.range else None, fns[-1] == _sampler.WAITING)] += 1
    return where

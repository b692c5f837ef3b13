"""Long runs keep memory flat: written chunks are recycled; without writes, the cap holds."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

LONG_RUN = """
import json, os, resource, sys
import mxprof
n, path, continuous = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
mxprof.set_config(filename=path, dump_period=1.0, continuous_dump=continuous,
                  aggregate_stats=True, profile_api=False, max_events=int(sys.argv[4]))
task = mxprof.Domain("long").new_task("step")
start, stop = task.start, task.stop
mxprof.set_state("run")
for _ in range(100_000):  # warm: the buffers' first chunks exist
    start(); stop()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(n):
    start(); stop()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mxprof.set_state("stop")
stats = json.loads(mxprof.dumps(format="json"))
print(json.dumps({"growth_mb": (peak - base) / 1024,
                  "count": stats["Time"]["long"]["step"]["Count"],
                  "dropped": stats["Profiler"]["dropped_events"]}))
"""


def long_run(tmp_path, n, path, continuous, max_events):
    script = tmp_path / "long.py"
    script.write_text(textwrap.dedent(LONG_RUN))
    proc = subprocess.run(
        [sys.executable, str(script), str(n), path, "1" if continuous else "0", str(max_events)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.devnull), reason="needs a null device")
def test_fifty_million_ranges_keep_rss_growth_under_64_mb(tmp_path):
    # The null device: what is measured is the buffers' recycling, not the disk
    # (a disk slower than the program fills memory up to max_events, then drops).
    result = long_run(tmp_path, 50_000_000, os.devnull, True, 10_000_000)
    assert result["count"] == 50_100_000
    assert result["dropped"] == 0
    assert result["growth_mb"] < 64, result


def test_without_writes_the_event_cap_bounds_memory(tmp_path):
    # 5 M ranges, nothing written until the end: the cap (1 M events, 24 MB)
    # holds; the rest are dropped and counted, the statistics stay exact.
    result = long_run(tmp_path, 5_000_000, str(tmp_path / "t.json"), False, 1_000_000)
    assert result["count"] == 5_100_000
    assert result["dropped"] == 5_100_000 - 1_000_000
    assert result["growth_mb"] < 48, result

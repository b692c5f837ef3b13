"""Eight threads record while a ninth dumps, pauses, resumes and switches files."""

import json
import threading
import time

import mxprof
from mxprof import _testing

WORKERS = 8
PER_WORKER = 5000


def test_record_while_dumping_pausing_and_switching_files(tmp_path):
    d = mxprof.Domain("stress")
    task, counter, marker = d.new_task("work"), d.new_counter("items", 0), d.new_marker("tick")
    paths = [tmp_path / "stress-0.json"]
    mxprof.set_config(
        filename=str(paths[0]),
        aggregate_stats=True,
        dump_period=0.01,
        profile_api=False,
        max_events=0,
    )
    mxprof.set_state("run")
    go = threading.Barrier(WORKERS + 1)
    done = threading.Event()
    rounds = [0]  # the control thread's
    recorded = []

    def worker():
        go.wait()
        i = 0
        # At least PER_WORKER each, and until the control thread made its rounds.
        while i < PER_WORKER or rounds[0] < 12:
            with task:
                counter.increment()
            if i % 100 == 0:
                marker.mark("thread")
                time.sleep(0)  # let the control thread have the GIL now and then
            if i >= PER_WORKER:
                # Waiting for the control thread: still recording, but slowly,
                # so that on a loaded machine its writes catch up with the
                # events (at full speed each round wrote more than the last,
                # and the rounds took minutes).
                time.sleep(0.001)
            i += 1
        recorded.append(i)

    def control():
        go.wait()
        k = 0
        while not done.is_set():
            k += 1
            rounds[0] = k
            mxprof.dump(finished=False)
            mxprof.dumps(format="json")
            mxprof.pause()
            mxprof.resume()
            if k % 2 == 0:
                paths.append(tmp_path / f"stress-{len(paths)}.json")
                mxprof.set_config(filename=str(paths[-1]))

    workers = [threading.Thread(target=worker, name=f"w{i}") for i in range(WORKERS)]
    ctl = threading.Thread(target=control, name="control")
    for t in [*workers, ctl]:
        t.start()
    for t in workers:
        t.join(timeout=300)
        assert not t.is_alive(), "a worker hung"
    done.set()
    ctl.join(timeout=300)
    assert not ctl.is_alive(), "the control thread hung"
    mxprof.set_state("stop")
    mxprof.dump()

    assert len(paths) > 1
    traces = [_testing.load_trace(p) for p in paths]  # every file is valid JSON
    stats = json.loads(mxprof.dumps(format="json"))
    in_files = sum(len(_testing.events(t, "X", "work")) for t in traces)
    samples = sorted(e["args"]["items"] for t in traces for e in _testing.events(t, "C", "items"))
    marks = sum(len(_testing.events(t, "i", "tick")) for t in traces)
    # Whatever fell into a pause is in neither; everything else is in exactly
    # one file and in the statistics, once.
    assert in_files == stats["Time"]["stress"]["work"]["Count"] > 0
    assert len(samples) == stats["Counter"]["stress"]["items"]["Count"]
    assert len(samples) == len(set(samples))  # no sample written twice
    assert marks == stats["Marker"]["stress"]["tick"]["Count"]
    assert counter.value == sum(recorded)  # the value counts in every state
    for t in traces:
        assert t["otherData"]["dropped_events"] == 0
        assert t["otherData"]["unmatched_stops"] == 0

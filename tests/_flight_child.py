"""Processes of a job with a flight recorder, started by tests/test_flight_job.py (spawn).

Each joins the job as a worker, records with a flight recorder (no trace
file), holds the range ``inside`` open while ticking a task ``tick`` every
few ms, says it is ready (``worker<r>.ready``), triggers once when
``worker<r>.trigger`` appears (its text is the reason), and exits when
``<workdir>/done`` appears (or after ``life`` seconds); with ``die``, at
once after its trigger (``sys.exit``, the way out of an uncaught
exception).  With ``block``, its main thread instead blocks in C (a lock's
wait) inside the range ``stuck_in_c`` and another thread triggers, as a
hang watchdog would; with ``watchdog`` seconds too, it runs steps (Frames)
until ``worker<r>.trigger`` appears, then blocks inside one, and mxprof's
own hang watchdog triggers.
"""

import os
import sys
import time


def serve(
    workdir,
    rank,
    num_workers,
    address,
    inside="allreduce",
    timeout=10.0,
    life=90.0,
    die=False,
    block=False,
    watchdog=0.0,
):
    os.chdir(workdir)
    import mxprof
    from mxprof import distributed

    try:
        distributed.init("worker", rank, num_workers, 0, address=address, timeout=timeout)
    except Exception as e:  # the test reads why
        with open(f"worker{rank}.error", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        return
    mxprof.set_config(filename="t.json", flight_recorder=5, flight_recorder_interval=0)
    if watchdog:
        mxprof.set_config(watchdog=watchdog)
    mxprof.set_state("run")
    domain = mxprof.Domain("train")
    tick = domain.new_task("tick")
    held = domain.new_task(inside)
    held.start()  # open at any trigger: the range this rank is in
    if block:
        return _blocked(rank, domain, watchdog)
    end = time.monotonic() + life
    ticked = triggered = False
    while time.monotonic() < end and not os.path.exists("done"):
        with tick:
            time.sleep(0.002)
        if not ticked:
            ticked = True
            open(f"worker{rank}.ready", "w").close()
        order = f"worker{rank}.trigger"
        if not triggered and os.path.exists(order):
            triggered = True
            with open(order) as f:
                reason = f.read()
            mxprof.trigger(reason, details={"stuck_thread": "MainThread", "rank": rank})
            open(f"worker{rank}.triggered", "w").close()
            if die:  # as a process dying of what triggered: at once, through exit
                sys.exit(3)
    distributed.shutdown()


def _blocked(rank, domain, watchdog):
    """The main thread blocked in one C call until ``done``; a watcher thread
    triggers (or, with ``watchdog``, mxprof's hang watchdog does)."""
    import threading

    import mxprof
    from mxprof import distributed

    release = threading.Event()

    def watch():
        triggered = False
        while not os.path.exists("done"):
            order = f"worker{rank}.trigger"
            if not triggered and not watchdog and os.path.exists(order):
                triggered = True
                with open(order) as f:
                    reason = f.read()
                mxprof.trigger(reason, details={"stuck_thread": "MainThread", "rank": rank})
                open(f"worker{rank}.triggered", "w").close()
            time.sleep(0.01)
        release.set()

    threading.Thread(target=watch, daemon=True).start()
    step = mxprof.Frame(domain, "step")
    if watchdog:
        open(f"worker{rank}.ready", "w").close()
        while not os.path.exists(f"worker{rank}.trigger"):
            with step:
                time.sleep(0.005)
    with step, domain.new_task("stuck_in_c"):
        open(f"worker{rank}.ready", "w").close()
        release.wait()  # one blocking call (a lock's acquire), GIL released
    distributed.shutdown()

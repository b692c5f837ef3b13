"""A process for tests/test_ctl.py to look into: python _ctl_child.py BLOCK STATE.

BLOCK: how its main thread waits, inside range train:step --
``sleep`` (time.sleep), ``lock`` (threading.Lock().acquire), ``gil`` (a C
call that keeps the GIL: libc's sleep through ctypes.PyDLL), ``spin`` (a
Python loop).
STATE: ``idle`` (the program never records), ``run`` (it records itself,
with statistics) or ``flight`` (a flight recorder of the last 5 s).  A worker thread records train:work ranges of 10 ms.
Prints "ready PID" once it can be asked; waits at most 60 s.
"""

import ctypes
import sys
import threading
import time

import mxprof


def main() -> None:
    block, state = sys.argv[1], sys.argv[2]
    mxprof.set_config(
        aggregate_stats=True, filename=sys.argv[3] if len(sys.argv) > 3 else "own.json"
    )
    domain = mxprof.Domain("train")
    step, work = domain.new_task("step"), domain.new_task("work")
    if state == "flight":  # a flight recorder of the last 5 s
        mxprof.set_config(flight_recorder=5)
    if state in ("run", "flight"):
        mxprof.set_state("run")

    def worker() -> None:
        while True:
            with work:
                time.sleep(0.01)

    threading.Thread(target=worker, name="worker", daemon=True).start()
    lock = threading.Lock()
    lock.acquire()
    print("ready", flush=True)
    with step:
        if block == "sleep":
            time.sleep(60)
        elif block == "lock":
            lock.acquire(timeout=60)
        elif block == "gil":
            ctypes.PyDLL(None).sleep(60)  # PyDLL keeps the GIL through the call
        elif block == "spin":  # running Python: the GIL changes hands every switch interval
            end = time.monotonic() + 60
            while time.monotonic() < end:
                pass


if __name__ == "__main__":
    main()

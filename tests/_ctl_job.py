"""One process of a loopback job for tests/test_ctl.py: python _ctl_job.py RANK WORKERS ADDRESS.

A worker of a distributed job (mxprof.distributed, ZeroMQ on loopback) that
never records by itself: its main thread runs train:step ranges of 0.2 s
(time.sleep) and a thread train:work ranges of 10 ms, so that `mxprof ctl
--job` finds something to show once it starts a recording.  Prints "ready"
once joined; ends after 90 s or when killed.
"""

import sys
import threading
import time

import mxprof
from mxprof import distributed


def main() -> None:
    rank, workers, address = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mxprof.set_config(aggregate_stats=True)
    distributed.init("worker", rank, workers, 0, address, timeout=60)
    domain = mxprof.Domain("train")
    step, work = domain.new_task("step"), domain.new_task("work")

    def worker() -> None:
        while True:
            with work:
                time.sleep(0.01)

    threading.Thread(target=worker, name="worker", daemon=True).start()
    print("ready", flush=True)
    end = time.monotonic() + 90
    while time.monotonic() < end:
        with step:
            time.sleep(0.2)


if __name__ == "__main__":
    main()

"""collect() at 64 to 1,024 ranks: the rank-0 worker's bandwidth and memory, simulated.

    python benchmarks/collect_scale.py [--ranks 64 256 1024] [--events 10000]

The rank-0 worker is the real one (``distributed.init``, its ZeroMQ ROUTER,
``collect``); the other ranks are simulated in this process: one thread
holds a DEALER socket per rank on loopback TCP and speaks the control
protocol as a peer would (open a channel with the job's secret, hello and
16 clock pings to join; at collect,
16 pings for the sync, then the upload of its trace piece by piece).  Every
rank serves the same synthetic trace, an mxprof JSON file of ``--events``
ranges (about 100 bytes each).  The merge is left out (replaced by a count
of the bytes received): this measures what the star itself costs, the
network phase of collect, apart from the merge that another benchmark
(``merge``) measures.

Printed per size: time for every rank to join, time of the collect's
network phase, bytes received and the rank-0 worker's bandwidth, its peak
RSS growth during the collect (``/proc/self/clear_refs`` resets the peak),
and the disk the received traces take there.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import sys
import tempfile
import threading
import time
from typing import Any

import zmq

import mxprof
from mxprof import distributed
from mxprof.distributed import _collect, _secret, _wire
from mxprof.trace import clock as _clock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collect import memory  # noqa: E402  (benchmarks/collect.py)

PINGS = 16


def synthetic_trace(events: int, workdir: str) -> bytes:
    """One process's trace: events ranges recorded for real, then read back."""
    path = os.path.join(workdir, "synthetic.json")
    mxprof.set_config(filename=path)
    mxprof.set_state("run")
    task = mxprof.Domain("sim").new_task("step")
    for _ in range(events):
        task.start()
        task.stop()
    mxprof.set_state("stop")
    mxprof.dump()
    with open(path, "rb") as f:
        return f.read()


class Ranks:
    """n simulated peers, all served by one thread."""

    def __init__(self, address: str, n: int, trace: bytes) -> None:
        secret = _secret.read(address)
        assert secret is not None, "the rank-0 worker left no secret for its address"
        self.secret = secret
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 4 * n + 64)
        self.trace = trace
        self.socks = []
        self.ids = iter(range(1, 1 << 62))
        self.state: dict[Any, dict[str, Any]] = {}
        for r in range(1, n + 1):
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
            self.socks.append(s)
            self.state[s] = {"rank": r, "pings": 0, "sync": None, "joined": False}
            self.state[s].update(nonce=os.urandom(_wire.NONCE), channel=None)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def send(self, s: Any, header: dict[str, Any], body: bytes = b"") -> None:
        channel = self.state[s]["channel"]
        if channel is None:  # the handshake, under the job's secret
            s.send_multipart(_wire.encode(self.secret, b"", header, body))
        else:
            s.send_multipart(channel.seal(header, body))

    def request(self, s: Any, kind: str, args: dict[str, Any]) -> None:
        self.send(s, {"type": kind, "id": next(self.ids), "args": args})

    def info(self, st: dict[str, Any]) -> dict[str, Any]:
        return {
            "role": "worker",
            "rank": st["rank"],
            "host": f"sim{st['rank']}",
            "pid": 100000 + st["rank"],
            "clock": _clock.IDENTITY.to_json(),
        }

    def start(self) -> None:
        for s, st in self.state.items():
            self.request(s, "open", {"nonce": st["nonce"].hex()})
        self.thread.start()

    def hello(self, s: Any, st: dict[str, Any], answer: dict[str, Any]) -> None:
        sid = bytes.fromhex(answer["args"]["channel"])
        st["channel"] = _wire.Channel(sid, _wire.channel_key(self.secret, sid, st["nonce"]))
        info = self.info(st)
        args = {k: info[k] for k in ("role", "rank", "host", "pid")}
        self.request(s, "hello", {**args, "version": mxprof.__version__, "file": "/nope"})

    def run(self) -> None:
        poller = zmq.Poller()
        for s in self.socks:
            poller.register(s, zmq.POLLIN)
        while not self.stop.is_set():
            for s, _ in poller.poll(100):
                while True:
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    channel = self.state[s]["channel"]
                    if channel is None:
                        header, _body = _wire.decode(self.secret, frames)
                    else:
                        header, _body = channel.unseal(frames)
                    self.handle(s, header)

    def handle(self, s: Any, header: dict[str, Any]) -> None:
        st = self.state[s]
        kind = header["type"]
        if st["channel"] is None:  # the answer to open
            self.hello(s, st, header)
            return
        if kind == "ok":  # an answer: to hello or to a ping
            if st["pings"] < PINGS:
                st["pings"] += 1
                self.request(s, "ping", {})
                return
            st["pings"] = 0
            if st["sync"] is not None:  # the sync's pings are done: answer it
                self.send(
                    s,
                    {"type": "ok", "re": st["sync"], "args": {"clock": self.info(st)["clock"]}},
                )
                st["sync"] = None
            else:
                st["joined"] = True
            return
        if kind == "sync":
            st["sync"] = header["id"]
            st["pings"] = 1
            self.request(s, "ping", {})
        elif kind == "upload":
            offset = header["args"]["offset"]
            chunk = self.trace[offset : offset + _wire.CHUNK]
            args = {"size": len(self.trace), "name": "t.json", "info": self.info(st)}
            self.send(s, {"type": "ok", "re": header["id"], "args": args}, chunk)
        elif kind == "bye":
            pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for s in self.socks:
            s.close(0)
        self.ctx.term()


def rss_mb() -> tuple[float, float]:
    """This process's current and peak resident memory, in MB (collect.py's reading)."""
    now = memory()
    return now["VmRSS"], now["VmHWM"]


def reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def one(n: int, trace: bytes, workdir: str) -> dict[str, float]:
    address = free_address()
    distributed.init("worker", 0, n + 1, 0, address=address, timeout=300)
    ranks = Ranks(address, n, trace)
    t0 = time.perf_counter()
    ranks.start()
    while len(distributed.members()) < n or not all(st["joined"] for st in ranks.state.values()):
        time.sleep(0.01)
    joined = time.perf_counter() - t0
    received = {"bytes": 0, "disk": 0}

    def count(
        paths: list[str], output: str, sources: Any = None, info: Any = None
    ) -> dict[str, Any]:
        received["bytes"] = sum(os.path.getsize(p) for p in paths)
        received["disk"] = received["bytes"]
        return {"events": 0, "inputs": [{"path": p} for p in paths]}

    real_merge = _collect.merge
    _collect.merge = count  # the network phase only
    base, _ = rss_mb()
    reset_peak()
    try:
        t0 = time.perf_counter()
        summary = distributed.collect(os.path.join(workdir, f"merged{n}.json"))
        took = time.perf_counter() - t0
    finally:
        _collect.merge = real_merge
    _, peak = rss_mb()
    failed = [g for g in summary["missing"] if g["failed"]]
    ranks.close()
    distributed.shutdown()
    return {
        "ranks": n + 1,
        "join_s": joined,
        "collect_s": took,
        "mb": received["bytes"] / 1e6,
        "mb_s": received["bytes"] / 1e6 / took,
        "peak_growth_mb": peak - base,
        "failed": len(failed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--events", type=int, default=10_000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # ~3 descriptors per rank
    workdir = tempfile.mkdtemp(prefix="mxprof-bench-scale-")
    try:
        trace = synthetic_trace(args.events, workdir)
        print(
            f"{socket.gethostname()}, Python {sys.version.split()[0]}, {os.cpu_count()} cores; "
            f"each rank's trace: {args.events} ranges, {len(trace) / 1e6:.2f} MB"
        )
        print("ranks  join s  collect s  received MB  rank-0 MB/s  peak RSS growth MB  failed")
        for n in args.ranks:
            r = one(n - 1, trace, workdir)
            print(
                f"{r['ranks']:5d}  {r['join_s']:6.2f}  {r['collect_s']:9.2f}  {r['mb']:11.0f}  "
                f"{r['mb_s']:11.0f}  {r['peak_growth_mb']:18.0f}  {r['failed']:6d}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""torch.distributed calls as ranges: op, dtype, bytes, process group (and peer).

``torch.distributed``'s collective and point-to-point functions are wrapped
(in ``torch.distributed`` and in ``distributed_c10d``, where torch's own
helpers such as ``all_gather_object`` look them up), and DDP's gradient
buckets go through a communication hook that issues them with the wrapped
``all_reduce``.  Only the outermost call on a thread is recorded:
``all_gather_into_tensor`` calling ``all_gather_single`` is one range.  A
function bound to another name before the wrapping (``from
torch.distributed import all_reduce`` at import time) keeps the original,
and so do torch's functional collectives (``torch.ops._c10d_functional``,
under FSDP2 and DTensor), which never pass through these functions.

A call's range is named by what it moves, so that its statistics and the
cross-rank analysis (:mod:`mxprof.report.ranks`) can read it back::

    all_reduce(float32, 4194304 B, group 0)
    send(float32, 1024 B, group 0, peer 1)
    all_reduce(float32, 1048576 B, group 0) ddp bucket 2

- *bytes*: what the call is about: the tensor of ``all_reduce``,
  ``broadcast``, ``reduce``, ``send``/``recv``; the gathered output of
  ``all_gather*``; the input of ``reduce_scatter*`` and ``all_to_all*``;
  this rank's tensor of ``gather``/``scatter``; 0 for ``barrier``.
- *dtype*: torch's name without ``torch.`` (``mixed`` for lists of several
  dtypes, ``none`` without tensors).
- *group*: the process group's name (``0`` is the default group).
- *peer*: the other rank of a point-to-point call (``any`` for a ``recv``
  from any source).

A blocking call is a task of domain ``torch.distributed`` on the calling
thread.  An asynchronous one (``async_op=True``, ``isend``/``irecv``,
DDP's buckets) is a range of domain ``torch.distributed.async`` from its
issue until its work completes (its future is done, or the first
``wait()`` returns where the backend gives no future, as gloo's
point-to-point calls), on a track ``torch.distributed async`` (one track
per handle in flight at once: ``async 2``, ``async 3`` ...).  With CUDA
tensors and :mod:`mxprof.cuda` available, each range is also timed on the
GPU (category ``torch.distributed,gpu``): from an event on the current
stream at the issue to one on the stream the result is ready on.

More than ``MAX_NAMES`` distinct names in a process (sizes that never
repeat) record the rest with ``? B``, so that the name registry stays
bounded.  Recording follows ``profile_imperative`` (or ``profile_all``) as
the module hooks do.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Iterable
from typing import Any, Callable

import torch

from ... import _native
from ..._native import NEW_THREAD, clock_ns, range_add, range_begin_token, range_end_token
from ..._threads import register_current
from ...domain import Domain
from ...errors import ProfilerError
from ._state import imperative_on

DOMAIN = "torch.distributed"
ASYNC_DOMAIN = "torch.distributed.async"
MAX_NAMES = 4096
TRACK = "torch.distributed async"

# op -> how its payload is read from the bound arguments: the argument names
# whose tensors (or lists of tensors) make its bytes, and its peer argument.
_PAYLOAD: dict[str, tuple[tuple[str, ...], str | None]] = {
    "all_reduce": (("tensor",), None),
    "all_reduce_coalesced": (("tensors",), None),
    "broadcast": (("tensor",), None),
    "reduce": (("tensor",), None),
    "all_gather": (("tensor_list",), None),
    "all_gather_single": (("output_tensor",), None),
    "all_gather_into_tensor": (("output_tensor",), None),
    "all_gather_coalesced": (("output_tensor_lists",), None),
    "gather": (("tensor",), None),
    "scatter": (("tensor",), None),
    "reduce_scatter": (("input_list",), None),
    "reduce_scatter_single": (("input",), None),
    "reduce_scatter_tensor": (("input",), None),
    "all_to_all": (("input_tensor_list",), None),
    "all_to_all_single": (("input",), None),
    "barrier": ((), None),
    "monitored_barrier": ((), None),
    "send": (("tensor",), "dst"),
    "recv": (("tensor",), "src"),
    "isend": (("tensor",), "dst"),
    "irecv": (("tensor",), "src"),
}
_ALWAYS_ASYNC = frozenset({"isend", "irecv"})


class _Local(threading.local):
    def __init__(self) -> None:
        self.depth = 0  # wrapped calls open on this thread
        self.label = ""  # appended to the next name (a DDP bucket)


_tls = _Local()


def _tensors(value: Any, out: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)


def describe(op: str, tensors: Iterable[torch.Tensor]) -> tuple[str, int]:
    """(dtype, bytes) of a call's payload tensors.

    Example:
        >>> describe("all_reduce", [torch.zeros(4)])
        ('float32', 16)
    """
    dtypes: set[str] = set()
    nbytes = 0
    for t in tensors:
        dtypes.add(str(t.dtype).removeprefix("torch."))
        nbytes += t.numel() * t.element_size()
    dtype = dtypes.pop() if len(dtypes) == 1 else ("mixed" if dtypes else "none")
    return dtype, nbytes


def call_name(
    op: str, dtype: str, nbytes: int | None, group: str, peer: str | None = None, label: str = ""
) -> str:
    """A recorded call's name (see the module docstring); nbytes None is ``?``.

    Example:
        >>> call_name("send", "float32", 1024, "0", "1")
        'send(float32, 1024 B, group 0, peer 1)'
    """
    size = "?" if nbytes is None else str(nbytes)
    tail = f", peer {peer}" if peer is not None else ""
    return f"{op}({dtype}, {size} B, group {group}{tail}){label}"


class _Lanes:
    """Tracks for handles in flight: a handle takes a free one and gives it back when done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: list[int] = []
        self.made = 0

    def take(self) -> int:
        with self.lock:
            if self.free:
                return self.free.pop()
            self.made += 1
            n = self.made
        name = TRACK if n == 1 else f"{TRACK} {n}"
        try:
            return _native.new_track(name)
        except ProfilerError:
            return 0

    def give(self, tid: int) -> None:
        if tid:
            with self.lock:
                self.free.append(tid)


class _Gpu:
    """CUDA timing of calls on CUDA tensors, through mxprof.cuda (cuda-python)."""

    def __init__(self) -> None:
        self.timing: Any = None
        self.state = 0  # 0: not probed, 1: usable, -1: not available
        self.ids: dict[str, int] = {}

    def begin(self, name: str, tensors: list[torch.Tensor]) -> Any:
        """The GPU span of a call on CUDA tensors (None when not timed)."""
        if not tensors or not tensors[0].is_cuda or self.state < 0:
            return None
        if self.state == 0:
            try:
                from ...cuda._runtime import runtime_state

                self.timing = runtime_state().timing
                self.state = 1
            except Exception as e:  # no cuda-python, no driver: host ranges only
                self.state = -1
                warnings.warn(
                    f"mxprof: collectives on CUDA tensors are timed on the host only: {e}",
                    stacklevel=4,
                )
                return None
        gid = self.ids.get(name)
        if gid is None:
            gid = self.ids[name] = _native.register(
                _native.KIND_GPU, DOMAIN.encode(), name.encode()
            )
        device = tensors[0].device
        return self.timing.begin(gid, current_stream(device))

    def end(self, span: Any, device: Any = None) -> None:
        """End span on the stream current now (where the call's result is ready)."""
        if span is None:
            return
        if device is not None:
            stream = current_stream(device)
            if stream != span.stream:
                span = span._replace(stream=stream)
        self.timing.end(span)


def current_stream(device: Any) -> int:
    """The handle of torch's current CUDA stream on device."""
    return int(torch.cuda.current_stream(device).cuda_stream)


class Recorder:
    """The wrapped functions' shared state: names, ids, tracks; installed once, counted."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users = 0
        self.saved: list[tuple[Any, str, Any]] = []  # (module, attribute, original)
        self.blocking: dict[tuple[Any, ...], int] = {}
        self.handles: dict[tuple[Any, ...], int] = {}
        self.groups: dict[int, tuple[Any, str]] = {}
        self.lanes = _Lanes()
        self.gpu = _Gpu()
        self.domains: tuple[Domain, Domain] | None = None
        self.failures = 0  # calls whose description failed (recorded without sizes)

    # ---- install / remove ----

    def install(self) -> None:
        import torch.distributed as dist

        with self.lock:
            self.users += 1
            if self.users > 1:
                return
            self.domains = (Domain(DOMAIN), Domain(ASYNC_DOMAIN))
            c10d = dist.distributed_c10d
            for op in _PAYLOAD:
                original = getattr(c10d, op, None)
                if original is None or getattr(original, "_mxprof", False):
                    continue
                wrapper = self._wrap(op, original)
                for module in (dist, c10d):
                    if getattr(module, op, None) is original:
                        self.saved.append((module, op, original))
                        setattr(module, op, wrapper)

    def remove(self) -> None:
        with self.lock:
            if self.users == 0:
                return
            self.users -= 1
            if self.users:
                return
            for module, op, original in reversed(self.saved):
                setattr(module, op, original)
            self.saved.clear()

    # ---- the wrapper ----

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)
        args_of, peer_arg = _PAYLOAD[op]
        always_async = op in _ALWAYS_ASYNC
        rec = self

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            st = _tls
            if (
                st.depth
                or not imperative_on()
                or not (_native.flags_update(0, 0) & _native.FLAG_RECORD)
            ):
                return original(*args, **kwargs)
            st.depth += 1
            try:
                try:
                    bound = signature.bind(*args, **kwargs)
                    bound.apply_defaults()
                    got = bound.arguments
                    tensors: list[torch.Tensor] = []
                    for a in args_of:
                        _tensors(got.get(a), tensors)
                    is_async = always_async or bool(got.get("async_op", False))
                    name, rid = rec._id(op, got, tensors, peer_arg, is_async)
                except Exception:  # never break the call for its description
                    rec.failures += 1
                    return original(*args, **kwargs)
                if is_async:
                    return rec._issue(original, args, kwargs, name, rid, tensors)
                span = rec.gpu.begin(name, tensors)
                token = range_begin_token(rid)
                if token & NEW_THREAD:
                    register_current()
                try:
                    return original(*args, **kwargs)
                finally:
                    range_end_token(rid, token)
                    if span is not None:
                        rec.gpu.end(span)
            finally:
                st.depth -= 1

        call._mxprof = True  # type: ignore[attr-defined]
        return call

    def _group(self, group: Any) -> str:
        import torch.distributed as dist

        if group is None:
            group = dist.distributed_c10d._get_default_group()
        known = self.groups.get(id(group))
        if known is None or known[0] is not group:
            name = getattr(group, "group_name", None)
            if not name:
                name = dist.distributed_c10d._world.pg_names.get(group) or str(id(group))
            known = self.groups[id(group)] = (group, str(name))
        return known[1]

    def _id(
        self,
        op: str,
        got: dict[str, Any],
        tensors: list[torch.Tensor],
        peer_arg: str | None,
        is_async: bool,
    ) -> tuple[str, int]:
        dtype, nbytes = describe(op, tensors)
        group = self._group(got.get("group"))
        peer: str | None = None
        if peer_arg is not None:
            value = got.get(peer_arg)
            if value is None:
                value = got.get("group_" + peer_arg)
            peer = "any" if value is None else str(value)
        label = _tls.label
        table = self.handles if is_async else self.blocking
        key: tuple[str, str, int | None, str, str | None, str]
        key = (op, dtype, nbytes, group, peer, label)
        rid = table.get(key)
        if rid is None and len(self.blocking) + len(self.handles) >= MAX_NAMES:
            key = (op, dtype, None, group, peer, label)  # bounded: sizes no longer count
            rid = table.get(key)
        name = call_name(op, dtype, key[2], group, peer, label)
        if rid is None:
            assert self.domains is not None
            rid = self.domains[1 if is_async else 0].new_task(name).id
            with self.lock:
                table[key] = rid
        return name, rid

    def _issue(
        self,
        original: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        rid: int,
        tensors: list[torch.Tensor],
    ) -> Any:
        span = self.gpu.begin(name, tensors)
        start = clock_ns()
        work = original(*args, **kwargs)
        if work is None:  # not a member of the group: nothing was issued
            if span is not None:
                self.gpu.end(span)
            return work
        lane = self.lanes.take()
        device = tensors[0].device if span is not None else None
        done = _Done(self, rid, lane, start, span, device)
        try:
            future = work.get_future()
        except Exception:  # gloo's point-to-point work has none: its wait() ends it
            return _waited(work, done)
        future.add_done_callback(done)
        return work


class _Done:
    """Ends one handle's range, once, when its work is complete."""

    __slots__ = ("device", "lane", "rec", "rid", "span", "start")

    def __init__(self, rec: Recorder, rid: int, lane: int, start: int, span: Any, device: Any):
        self.rec = rec
        self.rid = rid
        self.lane = lane
        self.start = start
        self.span = span
        self.device = device

    def __call__(self, _future: Any = None) -> None:
        start, self.start = self.start, 0
        if not start:
            return
        if self.lane:
            range_add(self.rid, self.lane, start, max(0, clock_ns() - start))
        self.rec.lanes.give(self.lane)
        if self.span is not None:
            self.rec.gpu.end(self.span, self.device)


def _waited(work: Any, done: _Done) -> Any:
    """work wrapped so that its wait() (or an is_completed() that says so) ends its range."""
    global _TimedWork
    if _TimedWork is None:
        _TimedWork = _timed_work_class()
    return _TimedWork(work, done)


_TimedWork: Any = None


def _timed_work_class() -> Any:
    import torch.distributed as dist

    class TimedWork(dist.Work):
        """A Work whose completion ends an mxprof range; everything else is the inner one's."""

        def __init__(self, inner: Any, done: _Done) -> None:
            super().__init__()
            self._inner = inner
            self._done = done

        def wait(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return self._inner.wait(*args, **kwargs)
            finally:
                self._done()

        def is_completed(self) -> bool:
            completed = bool(self._inner.is_completed())
            if completed:
                self._done()
            return completed

        def is_success(self) -> bool:
            return bool(self._inner.is_success())

        def exception(self) -> Any:
            return self._inner.exception()

        def source_rank(self) -> int:
            return int(self._inner.source_rank())

        def result(self) -> Any:
            return self._inner.result()

        def synchronize(self) -> None:
            self._inner.synchronize()

        def get_future(self) -> Any:
            return self._inner.get_future()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    return TimedWork


RECORDER = Recorder()


def ddp_bucket_hook(state: Any, bucket: Any) -> Any:
    """DDP's communication hook: a gradient bucket averaged as DDP's default
    does (divide by the group's size, then all-reduce), through the wrapped
    all_reduce, and named ``... ddp bucket <index>``."""
    import torch.distributed as dist

    pg: Any = state if state is not None else dist.group.WORLD
    buffer = bucket.buffer()
    buffer.div_(pg.size())
    _tls.label = f" ddp bucket {bucket.index()}"
    try:
        work = dist.all_reduce(buffer, group=pg, async_op=True)
    finally:
        _tls.label = ""
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP compares annotations with dist.GradBucket; as strings (postponed) they never match.
ddp_bucket_hook.__annotations__ = {}


def hook_ddp(model: Any) -> bool:
    """Register the bucket hook on a DistributedDataParallel model; False
    (with a warning) where it already has a communication hook or DDP
    refuses one now (its first backward has run)."""
    try:
        model.register_comm_hook(model.process_group, ddp_bucket_hook)
    except Exception as e:
        warnings.warn(
            "mxprof: DDP's gradient buckets are not named (their all_reduce calls are "
            f"recorded only if the model's own hook makes them through torch.distributed): {e}",
            stacklevel=3,
        )
        return False
    return True

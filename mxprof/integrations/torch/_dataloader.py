"""torch's DataLoader end to end: each batch from its worker to the wait for it.

What :func:`instrument_dataloader` records (domain ``dataloader``; the names
are the offline tier's, ``mxprof.trace.dataloader``, which reads them back):

* in every worker process (profiled by ``follow_children``): ``DataLoader
  batch`` around the production of one batch, inside it ``DataLoader
  getitem`` per sample (one range per ``__getitems__`` call where the data
  set has one; per ``next()`` for an IterableDataset) and ``DataLoader
  collate``; at the start of each batch the counters ``DataLoader batch
  index`` (the loader's batch number in this epoch) and ``DataLoader worker``
  (the worker's id);
* in the main process: ``DataLoader wait`` around each ``next()`` on the
  iterator, with the counter ``DataLoader wait index`` (the batch it waits
  for); ``DataLoader pin`` on the pin-memory thread per batch with
  ``DataLoader pin index``.

The counters carry the batch number because a range has no arguments in
the core; ``mxprof merge`` pairs each wait with the batch range of the same
number and writes the flow arrow (``s``/``f``) between them.

Not covered, said here and in the README: ``in_order=False`` (a wait is
joined to the batch it was expected to return), worker processes that are
not profiled (``follow_children`` off: the main process's waits only).
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch.utils.data._utils.fetch as _fetch
import torch.utils.data._utils.pin_memory as _pin
from torch.utils.data import DataLoader

from ..._session import SESSION
from ...counter import Counter
from ...domain import Domain
from ...errors import ConfigError
from ...trace.dataloader import (
    BATCH,
    BATCH_INDEX,
    COLLATE,
    DOMAIN,
    GETITEM,
    PIN,
    PIN_INDEX,
    WAIT,
    WAIT_INDEX,
    WORKER,
)

__all__ = ["ProfiledLoader", "instrument_dataloader"]


class _Recorder:
    """The ranges and counters of one process, made once (register once, record by id)."""

    def __init__(self) -> None:
        d = Domain(DOMAIN)
        self.batch = d.new_task(BATCH)
        self.getitem = d.new_task(GETITEM)
        self.collate = d.new_task(COLLATE)
        self.pin = d.new_task(PIN)
        self.wait = d.new_task(WAIT)
        self.batch_index = Counter(d, BATCH_INDEX)
        self.worker = Counter(d, WORKER)
        self.wait_index = Counter(d, WAIT_INDEX)
        self.pin_index = Counter(d, PIN_INDEX)


_rec: _Recorder | None = None


def _recorder() -> _Recorder:
    global _rec
    if _rec is None:
        _rec = _Recorder()
    return _rec


def _caller_index(default: int) -> int:
    """The batch number ``idx`` of torch's worker or pin loop calling us.

    torch hands the number beside the sample indices and never to the
    fetcher, so it is read from the caller's frame (once per batch);
    ``default`` where the caller has none (num_workers=0).
    """
    idx = sys._getframe(2).f_locals.get("idx")
    return idx if type(idx) is int else default


class _TimedDataset:
    """A map-style data set whose ``__getitem__`` is a ``DataLoader getitem`` range."""

    def __init__(self, dataset: Any, task: Any) -> None:
        self._dataset = dataset
        self._start, self._stop = task.start, task.stop

    def __getitem__(self, i: Any) -> Any:
        self._start()
        try:
            return self._dataset[i]
        finally:
            self._stop()

    def __len__(self) -> int:
        return len(self._dataset)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._dataset, name)
        if name == "__getitems__" and callable(found):
            start, stop = self._start, self._stop

            def timed(indices: Any) -> Any:
                start()
                try:
                    return found(indices)
                finally:
                    stop()

            return timed
        return found


class _TimedIter:
    """An IterableDataset's iterator whose ``next()`` is a ``DataLoader getitem`` range."""

    def __init__(self, it: Iterator[Any], task: Any) -> None:
        self._it = it
        self._start, self._stop = task.start, task.stop

    def __iter__(self) -> _TimedIter:
        return self

    def __next__(self) -> Any:
        self._start()
        try:
            return next(self._it)
        finally:
            self._stop()


def _timed_fn(fn: Any, task: Any) -> Any:
    start, stop = task.start, task.stop

    def timed(data: Any) -> Any:
        start()
        try:
            return fn(data)
        finally:
            stop()

    timed.__wrapped__ = fn  # type: ignore[attr-defined]
    return timed


def _time_fetcher(fetcher: Any, rec: _Recorder) -> None:
    """Put the timed data set (or iterator) and collate into one fetcher, once."""
    if getattr(fetcher, "_mxprof_timed", False):
        return
    if hasattr(fetcher, "dataset_iter"):
        fetcher.dataset_iter = _TimedIter(fetcher.dataset_iter, rec.getitem)
    else:
        fetcher.dataset = _TimedDataset(fetcher.dataset, rec.getitem)
    fetcher.collate_fn = _timed_fn(fetcher.collate_fn, rec.collate)
    fetcher._mxprof_timed = True


def _make_fetch(original: Any, worker: int) -> Any:
    """fetch(self, index) recorded as one ``DataLoader batch`` with its number."""
    rec = _recorder()
    start, stop = rec.batch.start, rec.batch.stop
    set_index, set_worker = rec.batch_index.set_value, rec.worker.set_value
    made = [0]  # batches of this worker: the number where the caller has none

    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        _time_fetcher(self, rec)
        idx = _caller_index(made[0])
        made[0] += 1
        start()
        try:
            set_index(idx)
            set_worker(worker)
            return original(self, possibly_batched_index)
        finally:
            stop()

    fetch.__wrapped__ = original  # type: ignore[attr-defined]
    return fetch


class _WorkerInit:
    """The loader's ``worker_init_fn``: instruments the worker, then calls the user's.

    A class (not a closure) so that the spawn start method can pickle it;
    unpickling it in a spawned worker imports mxprof's live tier, which
    starts the child's profile where ``follow_children`` offered one.
    """

    def __init__(self, user: Any) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        # The worker is a process of its own: patching torch's fetcher classes
        # here touches no other loader's process.
        for cls in (_fetch._MapDatasetFetcher, _fetch._IterableDatasetFetcher):
            original = getattr(cls.fetch, "__wrapped__", cls.fetch)
            cls.fetch = _make_fetch(original, worker_id)  # type: ignore[method-assign]
        if self.user is not None:
            self.user(worker_id)


# Loaders whose workers outlive their epochs: ended by _end_persistent at exit.
_persistent: weakref.WeakSet[DataLoader[Any]] = weakref.WeakSet()


def _end_persistent() -> None:
    """End the persistent workers of instrumented loaders the way torch ends any others.

    torch keeps a persistent loader's iterator (and its workers) until the
    loader is deleted, and at interpreter exit skips its own shutdown:
    multiprocessing then sends each daemonic worker SIGTERM, and torch's C
    handler in the worker leaves at once by ``_exit``, before any Python
    runs, so everything the worker recorded since its last background write
    was lost (with a job shorter than ``dump_period``, its whole file).
    Ending them here, before torch marks the exit (atexit runs handlers in
    reverse: this module registers after torch's), takes torch's own path:
    each worker is told to stop, returns from its loop and exits through
    multiprocessing's exit hook, where its trace is completed.  torch waits
    for each at most ``MP_STATUS_CHECK_INTERVAL`` and then terminates it.
    """
    for loader in list(_persistent):
        shutdown = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):  # a loader torch already shut down, or broke
                shutdown()


atexit.register(_end_persistent)

_pin_users = 0
_pin_original: Any = None


def _install_pin() -> None:
    """Time torch's ``pin_memory`` as called by its pin-memory thread (main process)."""
    global _pin_users, _pin_original
    _pin_users += 1
    if _pin_users > 1:
        return
    rec = _recorder()
    original: Any = _pin.pin_memory
    _pin_original = original
    start, stop, set_index = rec.pin.start, rec.pin.stop, rec.pin_index.set_value

    def pin_memory(data: Any, device: Any = None) -> Any:
        idx = _caller_index(-1)
        start()
        try:
            set_index(idx)
            return original(data, device)
        finally:
            stop()

    _pin.pin_memory = pin_memory


def _remove_pin() -> None:
    global _pin_users
    _pin_users -= 1
    if _pin_users == 0 and _pin_original is not None:
        _pin.pin_memory = _pin_original


class ProfiledLoader:
    """A DataLoader whose batches are recorded; iterate it as the loader.

    Other attributes (``dataset``, ``batch_size`` ...) and ``len()`` are the
    loader's.  ``remove()`` (or the end of a ``with`` block) gives the loader
    its own ``worker_init_fn`` back.
    """

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        self._user_init = loader.worker_init_fn
        self._pin = bool(loader.pin_memory) and loader.num_workers > 0
        self.active = True
        loader.worker_init_fn = _WorkerInit(self._user_init)
        if loader.persistent_workers and loader.num_workers > 0:
            _persistent.add(loader)
        if self._pin:
            _install_pin()
        self._release = weakref.finalize(self, _remove_pin) if self._pin else None

    def __iter__(self) -> Iterator[Any]:
        rec = _recorder()
        start, stop, set_index = rec.wait.start, rec.wait.stop, rec.wait_index.set_value
        it = iter(self.loader)
        if self.loader.num_workers == 0:
            # No workers: the batch is made inside next(), on this thread.
            fetcher = getattr(it, "_dataset_fetcher", None)
            if fetcher is not None and not hasattr(fetcher.fetch, "__wrapped__"):
                fetcher.fetch = _make_fetch(type(fetcher).fetch, 0).__get__(fetcher)
        n = 0
        while True:
            # The batch next() returns in order: torch's count of batches returned.
            idx = getattr(it, "_rcvd_idx", n)
            start()
            try:
                set_index(idx)
                batch = next(it)
            except StopIteration:
                return
            finally:
                stop()
            n += 1
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def remove(self) -> None:
        """Give the loader its own ``worker_init_fn`` back; safe to call twice."""
        if self.active:
            self.active = False
            self.loader.worker_init_fn = self._user_init
            if self._release is not None:
                self._release()

    def __enter__(self) -> ProfiledLoader:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.remove()


def instrument_dataloader(loader: DataLoader[Any]) -> ProfiledLoader:
    """Record each batch of loader from its worker to the step that waited for it.

    Iterate what this returns instead of the loader.  Worker processes are
    recorded when the profile follows children (``set_config(follow_children=
    True)``); the main process's waits always.  ``num_workers=0``: the
    batch, its samples and collate are recorded inside the wait, on the
    main thread.  IterableDataset: each ``next()`` of its iterator is a
    getitem.  ``persistent_workers`` on or off and the fork, forkserver and
    spawn start methods all work (spawn pickles the loader's
    ``worker_init_fn``: the user's must be picklable, as torch requires).

    Args:
        loader: a ``torch.utils.data.DataLoader``.

    Returns:
        A :class:`ProfiledLoader` to iterate; ``remove()`` undoes this.

    Warns:
        UserWarning: loader has workers and the profile does not follow
            children (they would record nothing).

    Raises:
        TypeError: loader is not a DataLoader.
        ConfigError: loader is already instrumented.

    Example:
        >>> import torch, mxprof
        >>> from mxprof.integrations.torch import instrument_dataloader
        >>> data = torch.utils.data.TensorDataset(torch.arange(8.0))
        >>> loader = instrument_dataloader(torch.utils.data.DataLoader(data, batch_size=4))
        >>> [b[0].tolist() for b in loader]
        [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"instrument_dataloader needs a DataLoader, got {type(loader).__name__}")
    if isinstance(loader.worker_init_fn, _WorkerInit):
        raise ConfigError("this DataLoader is already instrumented: remove() the first first")
    if loader.num_workers > 0 and not SESSION.config.follow_children:
        warnings.warn(
            "instrument_dataloader: the DataLoader's worker processes are not profiled "
            "(set_config(follow_children=True)): only the main process's waits are recorded",
            stacklevel=2,
        )
    return ProfiledLoader(loader)

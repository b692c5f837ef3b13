"""collect(): every process's trace on one timeline, as much of the job as answers.

The rank-0 worker waits for the job's processes, asks each connected one
for a new clock estimate (``sync``) and then for its trace (``upload``);
those that left earlier gave theirs as they left (a deposit).  A process
that is dead, frozen or unreachable does not stop the others: the merged
file is written with everything that came, plus the dead process's last
flushed file where the rank-0 worker can read it (same host, or shared
storage), found by the identity the file carries whatever it is called
(``_last_file``), and the missing processes
are named with the reason in the result, in the merged file's
``distributedInfo["missing"]`` and in a warning (or, with ``strict``, an
error raised after the file is written).

Time: waiting for processes to connect and for their sync answers shares one
deadline, ``timeout`` after the call (answers still get ``min(timeout,
SYNC_FLOOR)`` when the connect wait used it all up); a process that stops
answering in the middle of its upload costs one more ``timeout``; then the
merge, which takes the time its inputs need.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from .. import _session
from ..errors import TraceFormatError
from ..trace import _scan, manifest
from ..trace.merge import merge
from ._endpoint import PeerGone, RemoteFailure
from ._node import (
    LEAVE_TIMEOUT,
    DistributedError,
    DistributedTimeout,
    Hub,
    Known,
    Member,
    may_be_alive,
    trace_name,
    wall_ns,
)

SYNC_FLOOR = 2.0  # seconds the sync answers get at least
LOOK_AT = 64  # files looked at, newest first, in each folder a dead process wrote to
TRACE_SUFFIXES = (".json", ".json.gz")  # the formats whose trailer says whose they are


@dataclass
class Gap:
    """A process whose trace the merged file lacks, or has only in part."""

    process: str
    role: str
    rank: int
    why: str
    failed: bool  # dead, frozen or unreachable (not: its profiler never ran)
    timeout: bool = True  # the failure is a silence, not an error answer
    last_file: str | None = None  # its last flushed file, merged instead

    def to_json(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "role": self.role,
            "rank": self.rank,
            "why": self.why,
            "failed": self.failed,
            "last_file": self.last_file,
        }

    def sentence(self) -> str:
        merged = (
            f"; its last flushed file {os.path.basename(self.last_file)} is merged instead"
            if self.last_file
            else ""
        )
        return f"{self.process}: {self.why}{merged}"


@dataclass
class _Source:
    """One process's trace as collect gathered it."""

    path: str
    label: str
    identity: dict[str, Any]  # role, rank, host, pid where known
    uploaded: bool  # a copy rank 0 holds (upload or deposit), not the process's own file


def collect(hub: Hub, path: str, strict: bool, shared: bool = False) -> dict[str, Any]:
    """Every process's trace merged into path; with shared, a manifest of
    where they lie in path instead (``trace.manifest``): a process whose own
    file rank 0 can read (same host or shared storage, checked by the
    identity in the file) is named, not uploaded; the others upload into a
    folder beside the manifest."""
    timeout = hub.job.timeout
    deadline = time.monotonic() + timeout
    slots = hub.job.expected()
    found, _ = hub.present(slots, timeout, gone_ok=True)
    answer_within = max(deadline - time.monotonic(), min(timeout, SYNC_FLOOR))
    ask = {"flush": True} if shared else {}
    synced = hub.endpoint.request_many([k.src for k in found.values()], "sync", ask, answer_within)
    hub.note_files(found.values(), synced)
    out_dir = os.path.dirname(os.path.abspath(path))
    if shared:
        keep = f"{os.path.abspath(path)}.uploads"
        shutil.rmtree(keep, ignore_errors=True)  # a manifest written again: its uploads anew
        os.makedirs(keep)
        tmp = keep
    else:
        tmp = tempfile.mkdtemp(prefix="mxprof-collect-", dir=out_dir)
    sources: list[_Source] = []
    gaps: list[Gap] = []
    try:
        own = _session.SESSION.trace_now()
        if own is not None:
            sources.append(_Source(own, hub.me.label, _identity_of(hub.me), False))
        else:
            gaps.append(_never_ran(hub.me))
        for slot in slots:
            known = found.get(slot)
            answer = synced.get(known.src) if known is not None else None
            if known is not None and not isinstance(answer, BaseException):
                readable = _readable(known, answer) if shared else None
                if readable is not None:
                    sources.append(
                        _Source(readable, known.member.label, _identity_of(known.member), False)
                    )
                    continue
                try:
                    got = download(hub, known, tmp)
                except DistributedError as e:
                    gap = _failed(hub, slot, known, str(e), timeout=isinstance(e, TimeoutError))
                else:
                    if got is None:
                        gaps.append(_never_ran(known.member))
                    else:
                        sources.append(
                            _Source(got, known.member.label, _identity_of(known.member), True)
                        )
                    continue
            else:  # it left, is leaving, never came, or does not answer
                left = _deposited(hub, slot)
                if left is not None:
                    member, file = left
                    if shared:  # the hub's deposits go when it closes: a copy of its own
                        folder = os.path.join(tmp, f"{member.role}{member.rank}")
                        os.makedirs(folder, exist_ok=True)
                        file = shutil.copy(file, os.path.join(folder, os.path.basename(file)))
                    sources.append(_Source(file, member.label, _identity_of(member), True))
                    continue
                why = silence(hub, slot, known, answer, answer_within)
                gap = _failed(hub, slot, known, why)
                gap.timeout = not isinstance(answer, RemoteFailure)
            gaps.append(gap)
            if gap.last_file is not None:
                identity = {"role": gap.role, "rank": gap.rank}
                sources.append(_Source(gap.last_file, gap.process, identity, False))
        failed = [g for g in gaps if g.failed]
        if not sources:
            raise _error(
                failed,
                f"collect: no process had a trace for {path}; missing "
                + "; ".join(g.sentence() for g in gaps),
            )
        finish = _write_manifest if shared else _merged
        summary = finish(path, sources, gaps)
    finally:
        if not shared:
            shutil.rmtree(tmp, ignore_errors=True)
        elif not os.listdir(tmp):
            os.rmdir(tmp)
    summary["missing"] = [g.to_json() for g in gaps]
    if failed:
        message = (
            f"collect: {path} holds {len(summary['inputs'])} of {hub.job.world_size} "
            "processes' traces; missing " + "; ".join(g.sentence() for g in failed)
        )
        if strict:
            error = _error(failed, message)
            error.summary = summary  # type: ignore[attr-defined]
            raise error
        _session.warn(message)
    return summary


def _merged(path: str, sources: list[_Source], gaps: list[Gap]) -> dict[str, Any]:
    """The gathered traces merged into path; the summary names each process."""
    # Temporary copies, gone once merged: the merged file names each
    # process and its own file's name instead.
    names = [f"{s.label}: {os.path.basename(s.path)}" for s in sources]
    try:
        summary = merge([s.path for s in sources], path, sources=names, info=missing_info(gaps))
    except TraceFormatError as e:
        # A dead process's last file, read as it was being written, must
        # not cost the others: merge again without the last files.
        fallbacks = {g.last_file: g for g in gaps if g.last_file is not None}
        if not fallbacks:
            raise
        for gap in fallbacks.values():
            gap.why += f"; its last flushed file could not be merged ({e})"
            gap.last_file = None
        keep = [i for i, s in enumerate(sources) if s.path not in fallbacks]
        sources, names = [sources[i] for i in keep], [names[i] for i in keep]
        if not sources:
            raise
        summary = merge([s.path for s in sources], path, sources=names, info=missing_info(gaps))
    for item, source in zip(summary["inputs"], sources):
        item["process"] = source.label
        item["path"] = os.path.basename(item["path"])  # its own file's name
    return summary


def _write_manifest(path: str, sources: list[_Source], gaps: list[Gap]) -> dict[str, Any]:
    """The manifest of the gathered traces in path (written whole, then renamed)."""
    folder = os.path.dirname(os.path.abspath(path))
    inputs = []
    for s in sources:
        # Uploads lie beside the manifest and move with it; own files stay where they are.
        where = os.path.relpath(s.path, folder) if s.uploaded else os.path.abspath(s.path)
        inputs.append(
            {
                "path": where,
                "process": s.label,
                **s.identity,
                "size": os.path.getsize(s.path),
                "uploaded": s.uploaded,
            }
        )
    doc = {
        manifest.KEY: manifest.VERSION,
        "created_ns": wall_ns(),
        "inputs": inputs,
        "missing": [g.to_json() for g in gaps],
    }
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(temporary, path)
    return {"manifest": os.path.abspath(path), "inputs": inputs}


def _identity_of(member: Member) -> dict[str, Any]:
    return {"role": member.role, "rank": member.rank, "host": member.host, "pid": member.pid}


def _readable(known: Known, answer: Any) -> str | None:
    """The process's own trace file where this process can read it whole
    (None: it must upload): the file its sync answer named, holding at least
    the bytes it had written then, whose trailer names this very process
    (so a file of the same name on another host's disk is never taken)."""
    header = answer[0] if isinstance(answer, tuple) else answer  # (header, body)
    file, size = header.get("file"), header.get("size")
    if not isinstance(file, str) or not isinstance(size, int) or not file.endswith(TRACE_SUFFIXES):
        return None
    try:
        st = os.stat(file)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size < size:
        return None
    info = identity(file)
    m = known.member
    if info is None or (info.get("role"), info.get("rank"), info.get("host"), info.get("pid")) != (
        m.role,
        m.rank,
        m.host,
        m.pid,
    ):
        return None
    return file


def _error(failed: list[Gap], message: str) -> DistributedError:
    """A timeout when every failure is a silence; an error when one answered with one."""
    cls = DistributedTimeout if all(g.timeout for g in failed) else DistributedError
    return cls(message)


def _never_ran(member: Member) -> Gap:
    return Gap(member.label, member.role, member.rank, "its profiler never ran", failed=False)


def silence(
    hub: Hub, slot: tuple[str, int], known: Known | None, answer: Any, waited: float
) -> str:
    """Why a process gave no sync answer, in words."""
    timeout = hub.job.timeout
    if known is None:
        with hub.reg.lock:
            gone = hub.reg.departed.get(slot)
        if gone is not None:
            return "it left the job without leaving its trace"
        return (
            f"not connected within {timeout:g} s (not started, dead, or on another token or "
            "address)"
        )
    if not may_be_alive(known.member):
        return f"its process (pid {known.member.pid}) has exited"
    if isinstance(answer, TimeoutError):
        return f"no answer within {waited:.3g} s (frozen, hung or overloaded)"
    if isinstance(answer, PeerGone):
        return f"unreachable ({answer})"
    if isinstance(answer, RemoteFailure):
        return f"its clock sync failed: {answer.error}: {answer.message}"
    return f"no answer ({answer})"


def _failed(
    hub: Hub, slot: tuple[str, int], known: Known | None, why: str, timeout: bool = True
) -> Gap:
    """A Gap for a process that failed, with its last flushed file where readable."""
    if known is None:
        with hub.reg.lock:
            known = hub.reg.departed.get(slot)
    if known is None:
        return Gap(f"{slot[0]} {slot[1]}", slot[0], slot[1], why, True, timeout)
    gap = Gap(known.member.label, slot[0], slot[1], why, True, timeout)
    last, note = _last_file(known)
    gap.last_file = last
    if note:
        gap.why += f"; {note}"
    return gap


def _last_file(known: Known) -> tuple[str | None, str]:
    """The process's own last trace file, found by the identity it carries.

    Looked for among the files it named (at hello, at every change of its
    file name, in answers) and the other trace files in their folders,
    newest first: the first whose ``distributedInfo`` names this very
    process (role, rank, host and pid) is its last file, whatever it is
    called now.  None and why not when there is none ('' when it never said
    where its file is).
    """
    if not known.files:
        return None, ""
    m = known.member
    named = list(reversed(known.files))  # the last named first
    found: dict[str, float] = {}
    for path in named:
        folder = os.path.dirname(path)
        try:
            with os.scandir(folder) as entries:
                for e in entries:
                    if e.name.endswith(TRACE_SUFFIXES) and e.is_file():
                        found[e.path] = e.stat().st_mtime
        except OSError:
            continue
    for path in named:  # a named file is looked at even where its folder cannot be listed
        if path not in found:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):  # never a FIFO or a device: reading could block
                found[path] = st.st_mtime
    newest = sorted(found, key=lambda p: -found[p])
    others = set([p for p in newest if p not in named][:LOOK_AT])
    for path in (p for p in newest if p in others or p in named):
        info = identity(path)
        if info is not None and (
            info.get("role"),
            info.get("rank"),
            info.get("host"),
            info.get("pid"),
        ) == (m.role, m.rank, m.host, m.pid):
            return path, ""
    last = named[0]
    name = os.path.basename(last)
    if last not in found:
        return None, f"its last file {name} cannot be read here, nor another file of its own"
    if identity(last) is None:
        return None, f"its last file {name} has no readable distributedInfo (cut while written?)"
    return None, f"its last file {name} is another process's"


def identity(path: str) -> dict[str, Any] | None:
    """The distributedInfo in a trace file's trailer (None: none readable)."""
    try:
        with open(path, "rb") as f:
            info = _scan.metadata(f).get("distributedInfo")
    except (OSError, _scan.NotLines, ValueError, RecursionError):
        return None
    return info if isinstance(info, dict) else None


def missing_info(gaps: list[Gap]) -> dict[str, Any] | None:
    """What the merged file's distributedInfo says of the missing (Perfetto
    protobuf has no place for it: the result and the warning say it there)."""
    return {"missing": [g.to_json() for g in gaps]} if gaps else None


def _deposited(hub: Hub, slot: tuple[str, int]) -> tuple[Member, str] | None:
    """The trace a departed process left, waiting for one on its way."""
    deadline = time.monotonic() + LEAVE_TIMEOUT * 3
    with hub.reg.lock:
        while slot not in hub.reg.deposits and time.monotonic() < deadline:
            if not hub.arriving(slot):
                break
            hub.reg.lock.wait(0.05)
        return hub.reg.deposits.get(slot)


def download(
    hub: Hub, known: Known, tmp: str, kind: str = "upload", args: dict[str, Any] | None = None
) -> str | None:
    """known's trace (or, with kind and args, another file it serves in
    pieces: a flight recorder snapshot) into tmp, piece by piece; None: it
    never ran.

    Its size (declared in the first answer, at most the job's
    ``max_trace``) and name (a plain file name) are checked before a byte
    is written, and every piece against them.
    """
    m = known.member
    offset, size, dest = 0, None, None
    f = None
    try:
        while size is None or offset < size:
            try:
                answer, body = hub.endpoint.request(
                    known.src, kind, {**(args or {}), "offset": offset}, hub.job.timeout
                )
            except (TimeoutError, PeerGone) as e:
                raise DistributedTimeout(f"its upload stopped: {e}") from None
            except RemoteFailure as e:
                raise DistributedError(f"its upload failed: {e}") from None
            if answer.get("missing"):
                return None
            declared = answer.get("size")
            if not isinstance(declared, int) or not isinstance(answer.get("name"), str):
                raise DistributedError("its upload was malformed")
            if size is None:
                if not 0 <= declared <= hub.job.max_trace:
                    raise DistributedError(
                        f"its upload of {declared} bytes is over the limit of "
                        f"{hub.job.max_trace} bytes a process (MXPROF_MAX_TRACE_BYTES)"
                    )
                size = declared
                name = trace_name(answer["name"])
                os.makedirs(os.path.join(tmp, f"{m.role}{m.rank}"))
                dest = os.path.join(tmp, f"{m.role}{m.rank}", name)
                f = open(dest, "xb")  # noqa: SIM115 - closed in finally
            if declared != size or offset + len(body) > size:
                raise DistributedError(f"its upload changed its size or overran it at {offset}")
            if not body and offset < size:
                raise DistributedError("its upload stopped short")
            assert f is not None
            f.write(body)
            offset += len(body)
    finally:
        if f is not None:
            f.close()
    return dest

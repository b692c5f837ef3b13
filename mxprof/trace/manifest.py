"""A job's manifest: where every process's trace lies, for a merge run later, anywhere.

``distributed.collect(path, shared=True)`` writes one instead of a merged
trace when the processes' own files are where the rank-0 worker can read
them (a shared filesystem): a small JSON file naming each process (role,
rank, host, pid), its trace file and how many bytes that file held when the
job was collected, plus the processes that are missing and why.  Each file
carries its own clock estimates (its ``distributedInfo``, refreshed at the
collect), so ``mxprof merge MANIFEST -o job.pftrace`` puts the job on one
timeline later, on any machine that sees the files.

The shape (version 1)::

    {"mxprofManifest": 1,
     "created_ns": <wall-clock ns of the collect>,
     "inputs": [{"path": "...", "process": "worker 0 (host, pid 12)",
                 "role": "worker", "rank": 0, "host": "host", "pid": 12,
                 "size": <bytes at the collect>, "uploaded": false}, ...],
     "missing": [{"process": ..., "role": ..., "rank": ..., "why": ...,
                  "failed": ..., "last_file": ...}, ...]}

A relative ``path`` is relative to the manifest's folder (uploads that had
to be made are kept in a folder beside it).  A file that has moved, is gone
or holds fewer bytes than at the collect (cut) is not merged: it is named
among the missing, with the reason, and the others are merged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import TraceFormatError

KEY = "mxprofManifest"
VERSION = 1
MAX_BYTES = 64 << 20  # a manifest is small: one entry a process
_HEAD = re.compile(rb'\s*\{\s*"' + KEY.encode() + rb'"\s*:')


@dataclass
class Expanded:
    """A merge's inputs with the manifests among them replaced by their files."""

    paths: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    missing: list[dict[str, Any]] = field(default_factory=list)
    manifests: int = 0


def is_manifest(path: str) -> bool:
    """Whether path is a manifest: a small JSON object whose first key is
    ``mxprofManifest`` (a trace never starts so)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return _HEAD.match(head) is not None


def read(path: str) -> dict[str, Any]:
    """A manifest, checked.

    Raises:
        TraceFormatError: it cannot be read, is not JSON, is of another
            version, or an entry lacks a field (the message names which).
    """
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read the manifest: {e.strerror}") from None
    if len(text) > MAX_BYTES:
        raise TraceFormatError(f"{path}: a manifest of over {MAX_BYTES} bytes")
    try:
        doc = msgspec.json.decode(text)
    except msgspec.DecodeError as e:
        raise TraceFormatError(f"{path}: the manifest is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get(KEY) != VERSION:
        raise TraceFormatError(f"{path}: not a version-{VERSION} mxprof manifest")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise TraceFormatError(f"{path}: the manifest's inputs are not a list")
    for k, entry in enumerate(inputs):
        if not isinstance(entry, dict):
            raise TraceFormatError(f"{path}: manifest input {k} is not an object")
        for name, kind in (("path", str), ("process", str), ("size", int)):
            if not isinstance(entry.get(name), kind):
                raise TraceFormatError(f"{path}: manifest input {k} has no valid {name!r}")
    missing = doc.get("missing", [])
    if not isinstance(missing, list) or not all(isinstance(m, dict) for m in missing):
        raise TraceFormatError(f"{path}: the manifest's missing entries are not objects")
    return doc


def where(manifest: str, entry: dict[str, Any]) -> str:
    """An entry's file: a relative path is relative to the manifest's folder."""
    path = str(entry["path"])
    return path if os.path.isabs(path) else os.path.join(os.path.dirname(manifest), path)


def expand(paths: Sequence[str], sources: Sequence[str] | None, *, every: bool = False) -> Expanded:
    """paths with every manifest replaced by the files it names that are
    still there and whole; those that are not join ``missing`` (or, with
    ``every``, are an error).

    Args:
        paths: traces and manifests, in order.
        sources: a name for each path (None: the path).
        every: each of a manifest's files must be there and whole: for the
            analyses (``stats``, ``ranks``, ``export``, ``sql``), whose
            results would otherwise describe part of the job without saying
            so in them; ``merge`` names the missing in its output instead.

    Raises:
        TraceFormatError: a manifest is damaged (see ``read``), none of its
            files can be merged, or (``every``) one cannot; each file named,
            with why.

    Example:
        >>> expand(["rank0.json", "rank1.json"], None).paths
        ['rank0.json', 'rank1.json']
    """
    out = Expanded()
    for k, path in enumerate(paths):
        if not is_manifest(path):
            out.paths.append(path)
            out.sources.append(sources[k] if sources is not None else path)
            continue
        out.manifests += 1
        doc = read(path)
        out.missing.extend(doc.get("missing", []))
        kept = 0
        unusable = []
        for entry in doc["inputs"]:
            file = where(path, entry)
            why = _unusable(file, entry["size"])
            if why is not None and every:
                unusable.append(f"{entry['process']}: {why}")
                continue
            if why is not None:
                out.missing.append(
                    {
                        "process": entry["process"],
                        "role": entry.get("role"),
                        "rank": entry.get("rank"),
                        "why": why,
                        "failed": True,
                        "last_file": None,
                    }
                )
                continue
            out.paths.append(file)
            out.sources.append(f"{entry['process']}: {os.path.basename(file)}")
            kept += 1
        if unusable:
            raise TraceFormatError(
                f"{path}: {len(unusable)} of the manifest's {len(doc['inputs'])} traces "
                f"cannot be read: {'; '.join(unusable)}"
            )
        if not kept:
            gone = "; ".join(f"{m['process']}: {m['why']}" for m in out.missing)
            raise TraceFormatError(f"{path}: none of the manifest's traces can be merged: {gone}")
    return out


def _unusable(file: str, size: int) -> str | None:
    """Why a manifest's file cannot be merged (None: it can)."""
    try:
        now = os.path.getsize(file)
    except OSError as e:
        return f"its trace {file} is gone or moved since the collect ({e.strerror})"
    if now < size:
        return (
            f"its trace {file} holds {now} bytes, fewer than the {size} it held at the "
            "collect (cut or replaced)"
        )
    return None

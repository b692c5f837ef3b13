"""``mxprof view``: a trace, or a window of it, opened in the Perfetto UI.

As Perfetto's own ``open_trace_in_ui`` does: the file is served over HTTP on
127.0.0.1, to the page https://ui.perfetto.dev only (CORS), and the UI is
pointed at it with ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:PORT/NAME``;
the trace is read by the browser from this machine, never uploaded.

What is served is local-only and short-lived: the socket listens on the
loopback address; a request naming another host (``Host``, against DNS
rebinding) or coming from another page (``Origin``) is refused with 403;
only the trace's own path is served; the server stops once the trace has
been sent whole, after ``requests`` requests, or after ``timeout`` seconds
without one.  A window (``--window``) or a choice of ranks (``--ranks``), or
several traces, are first cut and merged into one temporary Perfetto file
(``mxprof merge``), so a window of a job too big for any viewer opens in
seconds.
"""

from __future__ import annotations

import http.server
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
import webbrowser
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import OutputError
from ..trace.merge import Window, merge
from ..trace.reader import open_trace, shown

UI = "https://ui.perfetto.dev"
_CHUNK = 1 << 20


class ViewError(OutputError):
    """The trace could not be served: the port is taken, or nothing fetched it in time."""


def url(port: int, name: str) -> str:
    """The Perfetto UI address that opens the trace served as name on port.

    Example:
        >>> url(9001, "job.pftrace")
        'https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/job.pftrace'
    """
    return f"{UI}/#!/?url=http://127.0.0.1:{port}/{urllib.parse.quote(name)}"


def prepare(
    paths: Sequence[str],
    folder: str,
    *,
    window: Window | None = None,
    ranks: Sequence[tuple[str | None, int, int]] | None = None,
) -> str:
    """The file to serve: the trace itself, or the window, ranks or several
    traces merged into folder as a Perfetto file.

    Raises:
        TraceReadError, TraceFormatError: a trace cannot be read.
    """
    if len(paths) == 1 and window is None and ranks is None:
        with open_trace(paths[0]):  # the reader's error, naming the problem
            pass
        return paths[0]
    base = os.path.basename(paths[0]).split(".")[0] or "trace"
    out = os.path.join(folder, f"{base}-view.pftrace")
    merge(paths, out, window=window, ranks=ranks)
    return out


def serve(
    path: str,
    *,
    port: int = 9001,
    requests: int = 8,
    timeout: float = 300.0,
    ready: Callable[[str], None] | None = None,
) -> int:
    """Serve path to the Perfetto UI on 127.0.0.1:port; return the times it was
    sent whole (0: it never was).

    Stops after the file was sent whole once, after ``requests`` requests, or
    after ``timeout`` seconds without a request.  ``ready(url)`` is called
    once the socket listens (port 0: any free port, named in the URL).

    Raises:
        ViewError: the port cannot be bound.

    Example:
        >>> serve("job.pftrace", ready=print)  # doctest: +SKIP
        https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/job.pftrace
        1
    """
    name = os.path.basename(path)
    state = {"sent": 0, "handled": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "mxprof-view"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            pass  # the command prints the URL, not a line per request

        def _allowed(self) -> bool:
            host = self.headers.get("Host", "")
            hosts = {f"127.0.0.1:{bound}", f"localhost:{bound}"}
            origin = self.headers.get("Origin")
            if host not in hosts or (origin is not None and origin != UI):
                self.send_error(403, "mxprof view serves https://ui.perfetto.dev on this host only")
                return False
            return True

        def _cors(self) -> None:
            self.send_header("Access-Control-Allow-Origin", UI)
            self.send_header("Vary", "Origin")
            self.send_header("Cache-Control", "no-cache")

        def do_OPTIONS(self) -> None:  # noqa: N802 - http.server's name
            state["handled"] += 1
            if not self._allowed():
                return
            self.send_response(204)
            self._cors()
            self.send_header("Access-Control-Allow-Methods", "GET, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "*")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            state["handled"] += 1
            if not self._allowed():
                return
            if urllib.parse.unquote(urllib.parse.urlsplit(self.path).path) != f"/{name}":
                self.send_error(404, "only the trace is served here")
                return
            size = os.path.getsize(path)
            self.send_response(200)
            self._cors()
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with open(path, "rb") as f:
                shutil.copyfileobj(f, self.wfile, _CHUNK)
            state["sent"] += 1

    try:
        server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    except OSError as e:
        raise ViewError(
            f"cannot serve on 127.0.0.1:{port}: {e.strerror or e} (another port: --port)",
            path,
            e.errno,
        ) from None
    bound = server.server_address[1]
    try:
        if ready is not None:
            ready(url(bound, name))
        server.timeout = min(timeout, 1.0)
        idle_since = time.monotonic()
        while state["sent"] == 0 and state["handled"] < requests:
            before = state["handled"]
            server.handle_request()
            if state["handled"] != before:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= timeout:
                break
    finally:
        server.server_close()
    return state["sent"]


def run(args: Any) -> int:
    """``mxprof view``: prepare, serve, say what happened (exit status)."""
    folder = tempfile.mkdtemp(prefix="mxprof-view-")
    try:
        path = prepare(args.traces, folder, window=args.window, ranks=args.ranks)

        def ready(address: str) -> None:
            print(f"Open the trace in the Perfetto UI:\n  {address}", flush=True)
            print(f"(serving {shown(path)} on 127.0.0.1 until the UI has fetched it)",
                  file=sys.stderr, flush=True)  # fmt: skip
            if args.open:
                webbrowser.open(address)

        sent = serve(path, port=args.port, requests=args.requests, timeout=args.timeout,
                     ready=ready)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not sent:
        raise ViewError(
            f"the trace was not fetched (after {args.requests} request(s) or "
            f"{args.timeout:g} s without one)",
            args.traces[0],
            None,
        )
    print("mxprof view: the trace was sent to the UI", file=sys.stderr)
    return 0

"""mxprof view: the trace served to the Perfetto UI on 127.0.0.1 only, checked
with a real HTTP client (no browser, no network)."""

import http.client
import subprocess
import sys
import threading
import urllib.parse

import mxprof
from mxprof.report import view

from ._sql_traces import steps, write

UI = "https://ui.perfetto.dev"


def serving(path, **kwargs):
    """serve() in a thread on a free port: (port, name, thread, result)."""
    ready = threading.Event()
    got = {}

    def announce(address):
        got["url"] = address
        ready.set()

    def run():
        got["sent"] = view.serve(str(path), port=0, ready=announce, **kwargs)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    served = urllib.parse.urlsplit(got["url"].split("url=", 1)[1])
    return served.port, served.path, thread, got


def fetch(port, path, headers):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_the_ui_fetches_the_trace_once_then_the_server_stops(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    port, path, thread, got = serving(trace)
    assert got["url"] == f"{UI}/#!/?url=http://127.0.0.1:{port}/t.json"
    response, body = fetch(port, path, {"Host": f"127.0.0.1:{port}", "Origin": UI})
    assert response.status == 200 and body == trace.read_bytes()
    assert response.getheader("Access-Control-Allow-Origin") == UI
    thread.join(30)
    assert not thread.is_alive() and got["sent"] == 1


def test_other_origins_hosts_and_paths_are_refused(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    port, path, thread, got = serving(trace, requests=4, timeout=30)
    evil = {"Host": f"127.0.0.1:{port}", "Origin": "https://evil.example"}
    assert fetch(port, path, evil)[0].status == 403
    rebound = {"Host": f"evil.example:{port}", "Origin": UI}  # DNS rebinding
    assert fetch(port, path, rebound)[0].status == 403
    assert fetch(port, "/etc/passwd", {"Host": f"localhost:{port}"})[0].status == 404
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("OPTIONS", path, headers={"Host": f"127.0.0.1:{port}", "Origin": UI})
    preflight = conn.getresponse()
    preflight.read()
    conn.close()
    assert preflight.status == 204 and preflight.getheader("Access-Control-Allow-Origin") == UI
    thread.join(30)  # four requests served, none of them the trace: it stops
    assert not thread.is_alive() and got["sent"] == 0


def test_a_window_is_cut_and_merged_first(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    out = view.prepare([str(trace)], str(tmp_path), window=("steps", 1, 1))
    assert out.endswith(".pftrace")
    names = sorted(e.name for e in mxprof.load(out) if e.ph == "X")
    # step 1 and what is in it; step 0 touches it at its end (merge keeps what
    # overlaps), step 0's forward and backward do not
    assert names == ["forward", "step", "step"]
    assert view.prepare([str(trace)], str(tmp_path)) == str(trace)  # served as it is


def test_the_command_prints_the_url_and_exits_once_served(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxprof", "view", str(trace), "--port", "0", "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("Open the trace in the Perfetto UI")
        address = proc.stdout.readline().strip()
        served = urllib.parse.urlsplit(address.split("url=", 1)[1])
        response, body = fetch(served.port, served.path,
                               {"Host": f"127.0.0.1:{served.port}", "Origin": UI})  # fmt: skip
        assert response.status == 200 and body == trace.read_bytes()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_nothing_fetched_in_time_is_exit_2(tmp_path, capsys):
    from mxprof import cli

    trace = write(tmp_path / "t.json", steps())
    status = cli.main(["view", str(trace), "--port", "0", "--timeout", "0.2"])
    assert status == 2
    assert "the trace was not fetched" in capsys.readouterr().err

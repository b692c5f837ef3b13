"""What every ``mxprof`` command does with unreadable input (one exit status, 2,
naming the file), corrupt and cut files, a reader that stops early, and the
defaults that need no flag (the report's path, ``stats`` reading no event)."""

import gzip
import json
import subprocess
import sys

import pytest

import mxprof
from mxprof import _testing, cli
from mxprof.trace import model
from mxprof.trace.reader import read_raw

# A file as the core writes it (native/src/mxp_chrome.c): its head, one event
# per line, the tail.  Cut anywhere after an event, it reads up to the cut.
CORE_HEAD = '{"displayTimeUnit":"ms","baseTimeNanoseconds":1795000000000000000,"traceEvents":[\n'


def core_text(n=20):
    lines = ['{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"python"}}']
    lines += [
        f'{{"name":"work","cat":"app","ph":"X","ts":{10 * i},"dur":5,"pid":1,"tid":1}}'
        for i in range(n)
    ]
    return CORE_HEAD + ",\n".join(lines) + '\n],\n"otherData":{"mxprof_version":"x"}}\n'


def foreign_text(n=20):
    """The same events as another writer puts them: one line, spaces."""
    events = [
        {"name": "work", "cat": "app", "ph": "X", "ts": 10 * i, "dur": 5, "pid": 1, "tid": 1}
        for i in range(n)
    ]
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})


def bad_crc(text):
    data = bytearray(gzip.compress(text.encode()))
    data[-8] ^= 0xFF  # the member's CRC-32 (its trailer: CRC, then length)
    return bytes(data)


CORRUPT_GZIP = {
    "bad_crc": lambda: bad_crc(core_text()),
    "garbage_after_the_magic": lambda: b"\x1f\x8b" + b"this is not deflate data" * 4,
    "garbage_after_the_stream": lambda: gzip.compress(core_text().encode()) + b"junk!",
    "cut_member_of_another_writer": lambda: gzip.compress(foreign_text().encode())[:-40],
}


@pytest.mark.parametrize("kind", sorted(CORRUPT_GZIP))
def test_a_corrupt_gzip_is_an_error_naming_the_file(tmp_path, kind):
    path = tmp_path / f"{kind}.json.gz"
    path.write_bytes(CORRUPT_GZIP[kind]())
    with pytest.raises(mxprof.TraceFormatError, match=f"{kind}.json.gz: ") as raised:
        mxprof.load(path)
    assert "gzip" in str(raised.value) or "cut short" in str(raised.value)
    with pytest.raises(mxprof.TraceFormatError):
        read_raw(path)


def test_a_gzip_cut_by_a_killed_core_reads_up_to_the_cut(tmp_path):
    packed = gzip.compress(core_text().encode())
    path = tmp_path / "killed.json.gz"
    path.write_bytes(packed[: len(packed) * 3 // 4])
    trace = mxprof.load(path)
    assert trace.truncated and 0 < len(trace) < 20
    assert {e.name for e in trace} == {"work"}


def test_a_cut_file_of_another_writer_is_an_error_that_names_repair(tmp_path):
    text = foreign_text()
    path = tmp_path / "theirs.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(mxprof.TraceFormatError, match="theirs.json: .*cut short.*mxprof repair"):
        mxprof.load(path)
    # The core's file cut at the same point reads up to the cut.
    text = core_text()
    (tmp_path / "ours.json").write_text(text[: len(text) // 2])
    trace = mxprof.load(tmp_path / "ours.json")
    assert trace.truncated and 0 < len(trace) < 20


def test_a_core_file_cut_in_its_head_is_an_error_and_after_it_a_killed_process(tmp_path):
    path = tmp_path / "early.json"
    path.write_text(CORE_HEAD[:30])  # whose file, cannot be told
    with pytest.raises(mxprof.TraceFormatError, match="early.json: .*nothing to read"):
        mxprof.load(path)
    # Killed in its first write: nothing recorded yet, and the file says so.
    path.write_text(core_text()[: len(CORE_HEAD) + 30])  # inside the process_name event
    trace = mxprof.load(path)
    assert trace.truncated and len(trace) == 0


def test_salvage_says_what_was_wrong_and_keeps_what_precedes_it(tmp_path):
    from mxprof.trace.reader import salvage

    path = tmp_path / "crc.json.gz"
    path.write_bytes(bad_crc(core_text()))
    events, metadata, problem = salvage(path)
    assert sum(e["ph"] == "X" for e in events) == 20
    assert problem.startswith("damaged gzip data (incorrect data check)")
    path.write_bytes(gzip.compress(core_text().encode()))
    assert salvage(path)[2] is None


# ---- the commands ----

# Each command with one input: the file, then the command's other arguments.
COMMANDS = {
    "stats": lambda f: ["stats", f],
    "merge": lambda f: ["merge", f, "-o", "merged.json"],
    "repair": lambda f: ["repair", f, "-o", "repaired.json"],
    "diff": lambda f: ["diff", "good.json", f],
    "ranks": lambda f: ["ranks", f],
    "export": lambda f: ["export", "--format", "collapsed", f, "-o", "out.txt"],
    "report": lambda f: ["report", f, "-o", "page.html"],
}
BAD_INPUTS = {
    "missing": None,
    "empty": b"",
    "corrupt_gzip": b"\x1f\x8b" + b"this is not deflate data" * 4,
}


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.json").write_text(core_text())
    return tmp_path


@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_exits_2_naming_an_unreadable_input(in_tmp, capsys, command, bad):
    name = f"{bad}.json.gz"
    if BAD_INPUTS[bad] is not None:
        (in_tmp / name).write_bytes(BAD_INPUTS[bad])
    assert cli.main(COMMANDS[command](name)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mxprof {command}: ") and name in err, err
    assert "Traceback" not in err
    for output in ("merged.json", "repaired.json", "out.txt", "page.html"):
        assert not (in_tmp / output).exists()  # nothing half-written


def test_run_exits_2_for_a_missing_script(in_tmp, capsys):
    assert cli.main(["run", "no_such_script.py"]) == 2
    err = capsys.readouterr().err
    assert err == "mxprof run: no such script: 'no_such_script.py'\n"


def test_the_exit_status_through_the_command(tmp_path):
    (tmp_path / "t.json").write_text(core_text())
    assert _testing.cli("stats", "t.json", cwd=tmp_path).returncode == 0
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(BAD_INPUTS["corrupt_gzip"])
    proc = _testing.cli("stats", bad.name, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("mxprof stats: bad.json.gz: ")
    assert _testing.cli("stats", "--top", "x", "t.json", cwd=tmp_path).returncode == 2  # usage


def test_repair_of_a_corrupt_gzip_says_what_it_recovered(in_tmp, capsys):
    (in_tmp / "crc.json.gz").write_bytes(bad_crc(core_text()))
    assert cli.main(["repair", "crc.json.gz", "-o", "fixed.json"]) == 0
    err = capsys.readouterr().err
    assert "crc.json.gz: damaged gzip data (incorrect data check)" in err
    assert "the 21 complete events before it written to fixed.json" in err
    assert [e.name for e in mxprof.load(in_tmp / "fixed.json")] == ["work"] * 20
    # Nothing to recover: an error, and the input is left as it was.
    garbage = BAD_INPUTS["corrupt_gzip"]
    (in_tmp / "g.json.gz").write_bytes(garbage)
    assert cli.main(["repair", "g.json.gz"]) == 2
    assert "g.json.gz: damaged gzip data" in capsys.readouterr().err
    assert (in_tmp / "g.json.gz").read_bytes() == garbage


def test_report_without_o_writes_beside_the_trace(in_tmp, capsys):
    pytest.importorskip("plotly")
    (in_tmp / "runs").mkdir()
    (in_tmp / "runs" / "train.json.gz").write_bytes(gzip.compress(core_text().encode()))
    assert cli.main(["report", "runs/train.json.gz"]) == 0
    assert capsys.readouterr().err == "mxprof report: written to runs/train.report.html\n"
    assert ">work<" in (in_tmp / "runs" / "train.report.html").read_text(encoding="utf-8")


def test_stats_reads_the_events_once(in_tmp, capsys, monkeypatch):
    """key_averages comes from load's one reading; nothing else reads the events again."""
    readings = []
    read_lines = model.read_lines

    def counted(path, sink):
        readings.append(path)
        return read_lines(path, sink)

    monkeypatch.setattr(model, "read_lines", counted)
    assert cli.main(["stats", "--format", "json", "good.json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["count"] == 20
    assert readings == ["good.json"]


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    """`mxprof stats --format json TRACE | head -1`: more output than a pipe
    holds, the reader gone after one line."""
    lines = [
        f'{{"name":"range {i:05}","cat":"app","ph":"X","ts":{i},"dur":1,"pid":1,"tid":1}}'
        for i in range(3000)
    ]
    (tmp_path / "wide.json").write_text(CORE_HEAD + ",\n".join(lines) + "\n]}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxprof", "stats", "--format", "json", "wide.json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # the reader goes: the rest (~700 kB) meets a closed pipe
        err = proc.stderr.read()
        status = proc.wait(timeout=120)
    finally:
        proc.kill()
    assert first == b"{\n"
    assert err == b"" and status == 0

"""The fuzz targets (tests/fuzz) run for a bounded time and find nothing.

MXPROF_FUZZ_SECONDS sets how long each runs (default 15).
"""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("atheris", reason="the fuzz targets run under atheris (pip install atheris)")

HERE = os.path.dirname(os.path.abspath(__file__))
SECONDS = int(os.environ.get("MXPROF_FUZZ_SECONDS", "15"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "seeds"),
    [
        ("fuzz_escape.py", "corpus"),
        ("fuzz_reader.py", "corpus"),  # JSON text
        ("fuzz_gzip.py", "corpus_gzip"),  # files through their gzip stream, as load reads them
        ("fuzz_perfetto.py", "corpus_perfetto"),
        ("fuzz_sqlite.py", "corpus_sqlite"),  # nvprof and Nsight databases (slower: sqlite)
        ("fuzz_wire.py", "corpus_wire"),  # the distributed wire decoder
    ],
)
def test_fuzz_target_finds_nothing(tmp_path, target, seeds):
    corpus = tmp_path / "corpus"
    shutil.copytree(os.path.join(HERE, "fuzz", seeds), corpus)  # the fuzzer adds to it
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "fuzz", target),
            str(corpus),
            f"-max_total_time={SECONDS}",
            "-rss_limit_mb=2048",
            "-print_final_stats=1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SECONDS + 300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "ERROR" not in log, log[-4000:]
    runs = [
        int(line.split()[-1])
        for line in log.splitlines()
        if "stat::number_of_executed_units" in line
    ]
    # It really ran (a database is opened by sqlite for each input: fewer runs).
    assert runs and runs[0] > (100 if target == "fuzz_sqlite.py" else 1000), log[-2000:]
    assert not list(tmp_path.glob("crash-*"))

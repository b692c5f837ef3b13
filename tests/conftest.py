"""Every test starts and ends with a clean profiler and writes only under tmp_path."""

import os

import pytest

from mxprof import _testing


@pytest.fixture(autouse=True)
def clean_profiler(tmp_path, monkeypatch):
    # The default filename is relative: keep any stray file inside tmp_path.
    monkeypatch.chdir(tmp_path)
    _testing.reset()
    yield
    _testing.reset()


@pytest.fixture
def trace_file(tmp_path):
    return os.fspath(tmp_path / "trace.json")


@pytest.fixture
def clock():
    """A frozen core clock; call clock(ns) to advance it."""
    with _testing.fake_clock(1_000_000_000) as advance:
        yield advance

#!/usr/bin/env bash
# The offline reader's C (native/offline) under AddressSanitizer and
# UndefinedBehaviorSanitizer: builds mxprof.trace._fastjson so in a copy of
# the tree (the core plainly, for the tests that record a trace) and runs
# tests/test_fastjson.py and tests/test_fastpftrace.py, the differential
# tests (JSON, .pftrace), against it.  The first report fails the run.
# .ci/run runs it; by hand: native/offline/asan.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for part in native mxprof tests pyproject.toml README.md; do
  cp -r "$repo/$part" "$work/$part"
done
find "$work/mxprof" -name '*.so' -delete
cd "$work"
"$python" -c "import sys; sys.path.insert(0, 'native'); import build_ffi; build_ffi.ffibuilder.compile(tmpdir='.')" >/dev/null
MXPROF_SANITIZE=address,undefined "$python" -c "import sys; sys.path.insert(0, 'native/offline'); import build_fastjson; build_fastjson.ffibuilder.compile(tmpdir='.')" >/dev/null
# (a check that the sanitizer is in: the module needs its runtime)
ldd mxprof/trace/_fastjson*.so | grep -q libasan
# CPython is not built with ASan: its runtime must be loaded first.  Python's
# own allocations are not checked for leaks (it keeps much until exit).
LD_PRELOAD="$(${CC:-gcc} -print-file-name=libasan.so)" \
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
PYTHONPATH="$work" "$python" -m pytest -q -p no:cacheprovider tests/test_fastjson.py \
  tests/test_fastpftrace.py \
  tests/test_parquet_fast.py  # the depth pass (mxo_depth.c), by the Parquet form

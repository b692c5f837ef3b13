#!/usr/bin/env bash
# Build the pure-C tests against the core's sources and run them.
#
#   native/tests/run.sh            plain build (-O2)
#   native/tests/run.sh asan       AddressSanitizer + UndefinedBehaviorSanitizer
#   native/tests/run.sh tsan       ThreadSanitizer
#
# CC picks the compiler (default gcc).  Exit status: the tests' own.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
native="$(dirname "$here")"
mode="${1:-plain}"
cc="${CC:-gcc}"
out="$here/build"
mkdir -p "$out"
flags=(-std=c11 -Wall -Wextra -Werror -g -pthread -I"$native/include" -I"$native/src")
case "$mode" in
  plain) flags+=(-O2) ;;
  asan) flags+=(-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all) ;;
  tsan) flags+=(-O1 -fsanitize=thread) ;;
  *) echo "usage: $0 [plain|asan|tsan]" >&2; exit 2 ;;
esac
libs=(-ldl) # NVTX's tool loader (mxp_nvtx.c)
if echo '#include <zlib.h>' | "$cc" -E - >/dev/null 2>&1; then
  flags+=(-DMXPI_HAVE_ZLIB=1)
  libs+=(-lz)
fi
# One program per test file (test_core.c: the core; test_sampler.c: the stack
# sampler against a synthetic interpreter), each linked with all of the core.
for test in test_core test_sampler; do
  "$cc" "${flags[@]}" "$here/$test.c" "$native"/src/*.c -o "$out/$test-$mode" "${libs[@]}"
  # The fake clock is exercised; the TSC source needs no special setup.
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}" \
    "$out/$test-$mode"
done

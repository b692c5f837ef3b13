#!/usr/bin/env bash
# Cross-compile the C core for another Linux architecture, and run its pure-C
# tests there through qemu-user when that is installed.
#
#   native/cross.sh [TRIPLE]        default: aarch64-linux-gnu
#
# Needs TRIPLE-gcc (Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu).  The
# tests run when qemu-ARCH is on PATH (apt-get install qemu-user) and the
# cross sysroot /usr/TRIPLE exists; otherwise the script says it skipped them.
# OUT picks the output directory (default native/build/TRIPLE): one object per
# native/src/*.c, libmxprof.a, and the test binary test_core.
#
# The flags are the extension's (native/build_ffi.py), so a warning that only
# another architecture shows -- say code used only by the x86 TSC clock --
# fails here as it would fail a build there.  zlib is used when the cross
# toolchain can link it (Debian: zlib1g-dev:arm64), as native/tests/run.sh does.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
triple="${1:-aarch64-linux-gnu}"
arch="${triple%%-*}"
cc="${CC:-$triple-gcc}"
ar="${AR:-$triple-ar}"
out="${OUT:-$here/build/$triple}"
if ! command -v "$cc" >/dev/null; then
  echo "cross.sh: $cc not found (Debian/Ubuntu: apt-get install gcc-$triple)" >&2
  exit 2
fi
mkdir -p "$out"
flags=(-std=c11 -O2 -Wall -Wextra -Werror -fvisibility=hidden -fPIC -pthread
       -I"$here/include" -I"$here/src")
libs=(-ldl) # NVTX's tool loader (mxp_nvtx.c)
probe='#include <zlib.h>
int main(void) { return zlibVersion() == 0; }'
if echo "$probe" | "$cc" -x c - -lz -o "$out/zlib-probe" >/dev/null 2>&1; then
  flags+=(-DMXPI_HAVE_ZLIB=1)
  libs+=(-lz)
fi
rm -f "$out/zlib-probe"
objects=()
for src in "$here"/src/*.c; do
  obj="$out/$(basename "${src%.c}").o"
  "$cc" "${flags[@]}" -c "$src" -o "$obj"
  objects+=("$obj")
done
rm -f "$out/libmxprof.a"
"$ar" rcs "$out/libmxprof.a" "${objects[@]}"
tests=(test_core test_sampler)
for test in "${tests[@]}"; do
  "$cc" "${flags[@]}" "$here/tests/$test.c" "$out/libmxprof.a" -o "$out/$test" "${libs[@]}"
done
echo "cross.sh: built ${#objects[@]} objects, libmxprof.a and ${tests[*]} for $triple in $out"

qemu="qemu-$arch"
if command -v "$qemu" >/dev/null && [ -d "/usr/$triple" ]; then
  for test in "${tests[@]}"; do
    QEMU_LD_PREFIX="/usr/$triple" "$qemu" "$out/$test"
  done
else
  echo "cross.sh: tests not run ($qemu or the sysroot /usr/$triple is missing;" \
    "apt-get install qemu-user)"
fi

#!/usr/bin/env bash
# Configures and builds topoccl into ${BUILD_DIR:-build}. Extra arguments go to cmake's configure.
set -euo pipefail
cd "$(dirname "$0")/.."
# nvcc ships outside the default PATH on Debian's CUDA packages; CUDA code is compiled whenever it exists.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# DEBUG_INFO=lines: line tables only (-g1) in RelWithDebInfo: the same code and backtraces with file:line, a
# quarter less compile time (what .ci/run builds with). Unset: full debug info.
# Both set the cache explicitly, so switching back and forth in one build directory takes effect.
case ${DEBUG_INFO:-full} in
  full) g=-g ;;
  lines) g=-g1 ;;
  *) echo "build.sh: DEBUG_INFO must be full or lines, not '$DEBUG_INFO'" >&2; exit 2 ;;
esac
debug_info=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 $g -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 $g -DNDEBUG")
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "${debug_info[@]}" "$@" >"$BUILD_DIR.configure.log" 2>&1 || {
  cat "$BUILD_DIR.configure.log"; exit 1; }
grep "topoccl:" "$BUILD_DIR.configure.log" || true
cmake --build "$BUILD_DIR" -j "$JOBS"

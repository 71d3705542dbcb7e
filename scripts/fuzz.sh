#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz with clang++ (-fsanitize=fuzzer,address,undefined) into
# ${TOPOCCL_FUZZ_BUILD_DIR:-build-fuzz} and runs the topology-loader fuzzer for [seconds] (default 60)
# with libFuzzer seed ${TOPOCCL_FUZZ_SEED:-0} (0: a fresh one, printed in the log) on a temporary copy of the seed corpus (tests/data/*.xml, tests/fuzz/corpus/*). Exits 0 without
# doing anything where no clang++ with libFuzzer is installed. A crash leaves its input in
# <build>/artifacts/; replay it with <build>/fuzz_topology_loaders <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${TOPOCCL_FUZZ_BUILD_DIR:-build-fuzz}
cxx=${TOPOCCL_FUZZ_CXX:-clang++}
jobs=${JOBS:-$(nproc)}

work=$(mktemp -d "${TMPDIR:-/tmp}/topoccl-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

# clang++ alone is not enough: the libFuzzer runtime (libclang_rt.fuzzer) ships separately on some distros.
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$work/probe.cpp"
if ! command -v "$cxx" >/dev/null 2>&1 ||
   ! "$cxx" -fsanitize=fuzzer,address,undefined "$work/probe.cpp" -o "$work/probe" >/dev/null 2>&1; then
  echo "fuzz: skipped (no clang++ with libFuzzer)"
  exit 0
fi

cmake -S tests/fuzz -B "$build" -DCMAKE_CXX_COMPILER="$cxx" >"$work/configure.log" 2>&1 || {
  cat "$work/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

mkdir -p "$work/corpus" "$build/artifacts"
cp tests/data/*.xml tests/fuzz/corpus/* "$work/corpus/"
# The largest seed (the DGX-2 hwloc dump) is ~42 KB; let inputs grow a little beyond it.
max_len=65536
echo "fuzz: fuzz_topology_loaders for ${seconds}s on $(ls "$work/corpus" | wc -l) seeds (max_len $max_len)"
status=0
"$build/fuzz_topology_loaders" -seed="${TOPOCCL_FUZZ_SEED:-0}" -max_total_time="$seconds" -max_len=$max_len -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$build/artifacts/" "$work/corpus" >"$work/fuzz.log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  tail -n 120 "$work/fuzz.log"
  echo "fuzz: FAILED (exit $status); reproducer in $build/artifacts/, replay: $build/fuzz_topology_loaders <file>"
  exit 1
fi
grep -E '(Seed: |^Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$work/fuzz.log" || true
echo "fuzz: passed"

#!/usr/bin/env bash
# Instructions per call of one small collective on one rank, counted by callgrind: a deterministic measure of the
# per-call path's cost, where timings of 0.3-1 us calls swing 2x between launches on a shared 2-core machine.
#   perf/compare/calls.sh [COLL] [NP] [RANK] [BYTES] [BUILD_DIR]
#   perf/compare/calls.sh broadcast 2 1          # the receiving rank of a 2-rank 8-byte broadcast
#   perf/compare/calls.sh alltoall 2 0 8 /tmp/before/build   # another build (a worktree of an earlier commit)
#   LD_LIBRARY_PATH=/tmp/baselib perf/compare/calls.sh alltoall 4 0 128   # another libnccl.so.2, same benchmark
# The counted rank runs under valgrind, about 50x slower, so its peers are ahead of it. With 2 ranks that makes its
# count the path of a call whose peer's data is already there; with more, peers that share a core with each other
# still keep it waiting at times. So it also prints the walks of the lanes (Execution::progress from the engine's
# loop) per call: a change that moves the count but not the walks changed the path, not how often it waited.
# In and out of place averaged; launches of one build agree to about 2% at 2 ranks and 4% at 4.
set -euo pipefail
COLL=${1:-alltoall} NP=${2:-2} RANK=${3:-0} BYTES=${4:-8} BUILD=${5:-build}
ITERS=${ITERS:-20000} WARMUP=100
command -v valgrind >/dev/null || { echo "calls.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
bin="$BUILD/perf/${COLL}_perf"
[ -x "$bin" ] || { echo "calls.sh: $bin not built" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# KEEP=FILE keeps the callgrind profile there, for callgrind_annotate. SETTINGS="NAME=VALUE ..." go to every rank.
settings=()
for setting in ${SETTINGS:-}; do settings+=(-x "$setting"); done
cat >"$out/wrap.sh" <<EOF
#!/usr/bin/env bash
if [ "\$OMPI_COMM_WORLD_RANK" = "$RANK" ]; then
  exec valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" --toggle-collect='*runPerf*' -q "\$@"
fi
exec "\$@"
EOF
chmod +x "$out/wrap.sh"
# The slow rank must not trip the stall timeout of the ranks waiting on it.
mpirun --allow-run-as-root --oversubscribe -np "$NP" -x TOPOCCL_TIMEOUT_MS=600000 ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} ${settings[@]+"${settings[@]}"} "$out/wrap.sh" "$bin" \
  -b "$BYTES" -e "$BYTES" -n "$ITERS" -w "$WARMUP" >"$out/bench.txt" 2>&1 || { cat "$out/bench.txt" >&2; exit 1; }
calls=$((2 * (ITERS + WARMUP)))  # out of place and in place
[ -n "${KEEP:-}" ] && cp "$out/callgrind.out" "$KEEP"
# The public entry point (ncclAllReduce, ncclBroadcast, ...), inclusive of everything it calls, and the engine's calls of
# Execution::progress (the caller line right before that function's own line in the caller tree).
callgrind_annotate --inclusive=yes --tree=caller --threshold=100 "$out/callgrind.out" 2>/dev/null |
  awk -v calls="$calls" -v what="$COLL $BYTES B, $NP ranks, rank $RANK" '
    /\* +([^ ]*\/)?src\/api\/nccl_api\.cpp:nccl[A-Z][A-Za-z]+ / && !total { gsub(",", "", $1); total = $1 }
    /< .*Communicator::runGroupLists\(\) \([0-9,]+x\)/ { last = $0; next }
    /\* .*Execution::progress\(\)/ && last != "" && !walks {
      walks = last; sub(/.*runGroupLists\(\) \(/, "", walks); sub(/x\).*/, "", walks); gsub(",", "", walks)
    }
    !/^ *$/ { last = "" }
    END {
      if (!total) { print "calls.sh: no nccl* entry point in the profile" > "/dev/stderr"; exit 1 }
      printf "%s: %.0f instructions per call", what, total / calls
      if (walks) printf ", %.2f walks of the lanes per call", walks / calls
      printf "\n"
    }'

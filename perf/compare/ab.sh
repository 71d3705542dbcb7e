#!/usr/bin/env bash
# A/B of one topoccl benchmark under two settings, interleaved (ABBA...), medians per size:
#   perf/compare/ab.sh NP COLL "BENCH_ARGS" REPEAT "ENV_A" "ENV_B"
#   perf/compare/ab.sh 4 all_reduce "-b 8 -e 64K -f 8 -n 100 -w 20 -c 1" 3 \
#       "NCCL_ALGO=allreduce:rd" "NCCL_ALGO=allreduce:direct"
# ENV_A / ENV_B: space-separated NAME=VALUE settings passed to every rank (-x). BUILD [build]: the build dir;
# BUILD_B [BUILD]: B's build dir, to compare two builds (say, a worktree of the last commit) under the same settings.
# Prints, per size, the out-of-place time and busbw of A and B (medians over REPEAT runs) and B/A.
set -euo pipefail
if [ $# -ne 6 ]; then sed -n '2,8p' "$0" >&2; exit 2; fi
# shellcheck disable=SC2034  # ENV_A and ENV_B are read through ${!settings}
NP=$1 COLL=$2 ARGS=$3 REPEAT=$4 ENV_A=$5 ENV_B=$6
BUILD=${BUILD:-build}
BUILD_B=${BUILD_B:-$BUILD}
# shellcheck disable=SC2034  # BENCH_A and BENCH_B are read through ${!bench}
BENCH_A="$BUILD/perf/${COLL}_perf" BENCH_B="$BUILD_B/perf/${COLL}_perf"
for b in "$BENCH_A" "$BENCH_B"; do
  [ -x "$b" ] || { echo "ab.sh: $b missing (cmake --build ${b%/perf/*})" >&2; exit 1; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= REPEAT; r++)); do
  order="A B"
  if ((r % 2 == 0)); then order="B A"; fi  # alternate, so that neither setting always runs first
  for v in $order; do
    settings=ENV_$v
    bench=BENCH_$v
    flags=()
    for e in ${!settings}; do flags+=(-x "$e"); done
    # shellcheck disable=SC2086  # ARGS is a list of flags
    mpirun --allow-run-as-root --oversubscribe -np "$NP" "${flags[@]}" "${!bench}" $ARGS 2>&1 |
      awk -v v="$v" '/^ +[0-9]/ {print v, $1, $6, $8}' >>"$out"
  done
  echo "ab.sh: repeat $r/$REPEAT done" >&2
done
python3 - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, size, t, bw = line.split()
    runs[(int(size), v)].append((float(t), float(bw)))
print("%12s %10s %10s %7s | %9s %9s %7s" % ("size (B)", "A us", "B us", "B/A", "A GB/s", "B GB/s", "B/A"))
for size in sorted({k[0] for k in runs}):
    a, b = runs[(size, "A")], runs[(size, "B")]
    if not a or not b:
        continue
    ta, tb = (statistics.median(x[0] for x in r) for r in (a, b))
    ba, bb = (statistics.median(x[1] for x in r) for r in (a, b))
    print("%12d %10.2f %10.2f %7.2f | %9.2f %9.2f %7s" % (size, ta, tb, tb / ta if ta else 0, ba, bb,
                                                          "%.2f" % (bb / ba) if ba else "-"))
PY

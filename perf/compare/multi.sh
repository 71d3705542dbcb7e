#!/usr/bin/env bash
# Several configurations of one collective, interleaved (the order rotates each repeat), medians of the
# out-of-place time per size:
#   perf/compare/multi.sh NP COLL "BENCH_ARGS" REPEAT "LABEL|BUILD_DIR|ENV ..." ...
#   perf/compare/multi.sh 4 all_reduce "-b 64K -e 16M -f 4 -n 20 -w 5" 3 \
#       "ring|build|NCCL_ALGO=allreduce:ring" "hd|build|NCCL_ALGO=allreduce:hd" "mpishm|build/compare|"
# A configuration runs BUILD_DIR/perf/COLL_perf with its NAME=VALUE settings, except the labels `mpishm` and
# `mpi` (OpenMPI over vader / over TCP), which run BUILD_DIR/mpi_perf (perf/compare builds it in build/compare).
# A setting that starts with -- is a flag for that configuration's benchmark instead ("heap|build|--heap").
# WRAP, if set, prefixes every rank's command, e.g. WRAP=perf/compare/pin.sh with PIN=pairs in a configuration.
# RUNS=1 also prints every launch's time per size, in launch order, to show levels a median hides.
# PLACE=in takes the in-place time instead (OpenMPI's mpi_perf: MPI_IN_PLACE).
set -euo pipefail
if [ $# -lt 5 ]; then sed -n '2,8p' "$0" >&2; exit 2; fi
NP=$1 COLL=$2 ARGS=$3 REPEAT=$4
shift 4
configs=("$@")
case ${PLACE:-out} in
  out) column=6 ;;
  in) column=10 ;;
  *) echo "multi.sh: PLACE must be out or in, not '$PLACE'" >&2; exit 2 ;;
esac
out=$(mktemp)
trap 'rm -f "$out"' EXIT
n=${#configs[@]}
wrap=()
if [ -n "${WRAP:-}" ]; then wrap=("$WRAP"); fi
for ((r = 1; r <= REPEAT; r++)); do
  for ((i = 0; i < n; i++)); do
    IFS='|' read -r label build envs <<<"${configs[$(((i + r) % n))]}"
    flags=()
    extra=()
    for e in $envs; do
      case $e in
        --*) extra+=("$e") ;;  # a flag for this configuration's benchmark, e.g. --heap
        *) flags+=(-x "$e") ;;
      esac
    done
    case $label in
      mpishm) cmd=(--mca btl "vader,self" "${flags[@]}" "${wrap[@]}" "$build/mpi_perf" --coll "$COLL") ;;
      mpi) cmd=(--mca btl "tcp,self" "${flags[@]}" "${wrap[@]}" "$build/mpi_perf" --coll "$COLL") ;;
      *) cmd=("${flags[@]}" "${wrap[@]}" "$build/perf/${COLL}_perf") ;;
    esac
    # shellcheck disable=SC2086  # ARGS is a list of flags
    mpirun --allow-run-as-root --oversubscribe -np "$NP" "${cmd[@]}" $ARGS "${extra[@]}" 2>&1 |
      awk -v v="$label" -v col="$column" '/^ +[0-9]/ {print v, $1, $col}' >>"$out"
  done
  echo "multi.sh: repeat $r/$REPEAT done" >&2
done
RUNS=${RUNS:-0} PLACE=${PLACE:-out} python3 - "$out" "${configs[@]}" <<'PY'
import collections, os, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, size, t = line.split()
    runs[(int(size), label)].append(float(t))
labels = [c.split('|')[0] for c in sys.argv[2:]]
print("%12s " % "size (B)" + " ".join("%12s" % l for l in labels) + "   (us, medians, %s)" % ("in place" if os.environ.get("PLACE") == "in" else "out of place"))
for size in sorted({k[0] for k in runs}):
    print("%12d " % size + " ".join("%12.2f" % statistics.median(runs[(size, l)]) if runs[(size, l)] else "%12s" % "-"
                                     for l in labels))
if os.environ.get("RUNS") == "1":
    print("every launch (us):")
    for size in sorted({k[0] for k in runs}):
        for l in labels:
            if runs[(size, l)]:
                print("%12d %12s " % (size, l) + " ".join("%.2f" % t for t in runs[(size, l)]))
PY

#!/usr/bin/env bash
# Issue 6's benchmarks on the emulated cluster (tests/cluster/cluster.sh), as root, side by side with OpenMPI:
#  A. 2 hosts x 2 ranks, NIC A 2 Gbit/s + NIC B 500 Mbit/s each: 64 MiB all-reduce. topoccl (hierarchical over
#     both NICs; synthesized; flat ring over both; flat ring over NIC A) and OpenMPI (both NICs; NIC A), against
#     the ceiling S / (one host's summed NIC goodput, calibrated).
#  B. 4 hosts x 2 ranks, same NICs: all-reduce and all-gather at 16 and 64 MiB. topoccl (default plan;
#     synthesized; flat ring over NIC A) with the cost model's prediction for each, and OpenMPI over both NICs.
# Each configuration runs REPEAT times, interleaved; the tables give medians and the spread (min-max).
# SECTIONS="A" or "B" runs one of them.
#   BUILD=build REPEAT=3 perf/cluster/run.sh        (writes perf/cluster/results/<UTC time>/)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="$(cd "${BUILD:-$ROOT/build}" && pwd)"
REPEAT="${REPEAT:-3}"
CLUSTER="$ROOT/tests/cluster/cluster.sh"
OUT="${OUT:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}"
die() { echo "perf/cluster/run.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ -x "$BUILD/perf/all_reduce_perf" ] || die "$BUILD/perf/all_reduce_perf missing: build with MPI first (scripts/build.sh)"
command -v python3 >/dev/null || apt-get install -y --no-install-recommends python3 >/dev/null
make -s -C "$ROOT/perf/compare" BIN="$BUILD/compare" "$BUILD/compare/mpi_perf" || die "cannot build perf/compare's mpi_perf"
mkdir -p "$OUT"
PREFIX=tpc
cleanup() { "$CLUSTER" down -p "$PREFIX" 2>/dev/null || true; }
trap cleanup EXIT

# subset FILE NIC_INDEX... : the cluster file with only those NICs (and their fits)
subset() {
  python3 - "$@" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1])); keep = {f"eth{i}" for i in sys.argv[2:]}
for h in doc["hosts"]: h["nics"] = [n for n in h["nics"] if n["name"] in keep]
print(json.dumps(doc, indent=1))
EOF
}

# run LABEL FILE -- mpirun args: appends "label repeat time_us [predicted_us plan]" to $OUT/times.txt
run() {
  local label="$1" rep="$2" log="$OUT/$1.r$2.log"; shift 2
  "$CLUSTER" mpirun -p "$PREFIX" -s 2 -T 600 "$@" > "$log" 2>&1 || { tail -20 "$log"; die "$label failed (log $log)"; }
  awk -v l="$label" -v r="$rep" '
    $1 ~ /^[0-9]+$/ && NF >= 13 { size = $1; t[size] = $6 }
    /^#  predicted/ { for (i = 1; i <= NF; i++) if ($i == "out-of-place:") { plan[size] = $(i + 1); pred[size] = $(i + 2) } }
    END { for (s in t) printf "%s %s %s %s %s %s\n", l, s, r, t[s], (s in pred ? pred[s] : "-"), (s in plan ? plan[s] : "-") }' \
    "$log" >> "$OUT/times.txt"
}

SECTIONS="${SECTIONS:-A B}"
if [[ " $SECTIONS " == *" A "* ]]; then
echo "== A: 2 hosts x 2 ranks, 64 MiB all-reduce" | tee "$OUT/progress.txt"
"$CLUSTER" up -p "$PREFIX" -n 2 -k 2 -r 2gbit,500mbit
"$CLUSTER" calibrate -p "$PREFIX" -s 2 -b "$BUILD" > "$OUT/a-cluster.json" 2>> "$OUT/progress.txt"
subset "$OUT/a-cluster.json" 0 > "$OUT/a-nicA.json"
AR=("$BUILD/perf/all_reduce_perf" -b 64M -e 64M -n 5 -w 1 -c 0 --predict)
MPI=("$BUILD/compare/mpi_perf" --coll all_reduce -b 64M -e 64M -n 5 -w 1 -c 0)
for rep in $(seq 1 "$REPEAT"); do
  echo "repeat $rep/$REPEAT" | tee -a "$OUT/progress.txt"
  run a.topoccl.default "$rep" -x TOPOCCL_CLUSTER_FILE="$OUT/a-cluster.json" -- "${AR[@]}"
  run a.topoccl.synthesized "$rep" -x TOPOCCL_CLUSTER_FILE="$OUT/a-cluster.json" -x TOPOCCL_SYNTHESIZE=allreduce \
    -x TOPOCCL_PLAN_CACHE_DIR="$OUT/plans" -- "${AR[@]}"
  run a.topoccl.ring-both-nics "$rep" -x TOPOCCL_CLUSTER_FILE="$OUT/a-cluster.json" -x NCCL_ALGO=ring -- "${AR[@]}"
  run a.topoccl.ring-nicA "$rep" -x TOPOCCL_CLUSTER_FILE="$OUT/a-nicA.json" -x NCCL_ALGO=ring -- "${AR[@]}"
  run a.openmpi.both-nics "$rep" --nics 0,1 -- "${MPI[@]}"
  run a.openmpi.nicA "$rep" --nics 0 -- "${MPI[@]}"
done
"$CLUSTER" down -p "$PREFIX"
fi

if [[ " $SECTIONS " == *" B "* ]]; then
echo "== B: 4 hosts x 2 ranks, all-reduce and all-gather at 16 and 64 MiB" | tee -a "$OUT/progress.txt"
"$CLUSTER" up -p "$PREFIX" -n 4 -k 2 -r 2gbit,500mbit
"$CLUSTER" calibrate -p "$PREFIX" -s 2 -b "$BUILD" > "$OUT/b-cluster.json" 2>> "$OUT/progress.txt"
subset "$OUT/b-cluster.json" 0 > "$OUT/b-nicA.json"
for rep in $(seq 1 "$REPEAT"); do
  echo "repeat $rep/$REPEAT" | tee -a "$OUT/progress.txt"
  for coll in all_reduce all_gather; do
    P=("$BUILD/perf/${coll}_perf" -b 16M -e 64M -f 4 -n 3 -w 1 -c 0 --predict)
    run "b.$coll.topoccl.default" "$rep" -x TOPOCCL_CLUSTER_FILE="$OUT/b-cluster.json" -- "${P[@]}"
    run "b.$coll.topoccl.synthesized" "$rep" -x TOPOCCL_CLUSTER_FILE="$OUT/b-cluster.json" \
      -x TOPOCCL_SYNTHESIZE="${coll//_/}" -x TOPOCCL_PLAN_CACHE_DIR="$OUT/plans" -- "${P[@]}"
    run "b.$coll.topoccl.flat-ring-nicA" "$rep" -x TOPOCCL_CLUSTER_FILE="$OUT/b-nicA.json" -x NCCL_ALGO=ring -- "${P[@]}"
    run "b.$coll.openmpi.both-nics" "$rep" --nics 0,1 -- "$BUILD/compare/mpi_perf" --coll "$coll" -b 16M -e 64M -f 4 -n 3 -w 1 -c 0
  done
done
fi

python3 "$HERE/report.py" "$OUT" | tee "$OUT/results.md"
echo "results: $OUT/results.md"

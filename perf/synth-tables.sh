#!/usr/bin/env bash
# Modelled synthesizer tables (issue 4): topoccl-synth on the presets, one file per (topology, collective) under
# perf/results/synth-<topo>[-x<hosts>]-<coll>.txt. Times are simulated on CostModel::fromTopology, not measured.
# Usage: perf/synth-tables.sh [build-dir]   (default: build)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
synth="$build/tools/topoccl-synth"
out="$here/results"
mkdir -p "$out"
run() {  # topo hosts coll sizes
  local name="synth-$1"
  [[ "$2" -gt 1 ]] && name+="-x$2"
  name+="-$3.txt"
  echo "perf/synth-tables.sh: $name" >&2
  { echo "# command: build/tools/topoccl-synth --topo $1 --hosts $2 --coll $3 --sizes $4 --factor 4"
    "$synth" --topo "$1" --hosts "$2" --coll "$3" --sizes "$4" --factor 4 --quiet; } > "$out/$name"
}
for coll in allgather reducescatter allreduce alltoall; do run dgx1 1 "$coll" 1K:1G; done
for coll in allgather allreduce; do
  run ndv2 2 "$coll" 1K:1G
  run dgx-a100 2 "$coll" 1K:1G
done

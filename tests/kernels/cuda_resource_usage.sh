#!/usr/bin/env bash
# Fails unless every CUDA kernel, for each GPU architecture, has no stack frame, no spills (no local memory in the
# hot loops) and at most MAX_REGISTERS registers. Reads the report ptxas wrote when the build compiled each object
# (`--resource-usage`, kept by cmake/ptxas_report_launcher.sh as OBJECT.resource-usage.txt): nvcc only, no GPU,
# and no second compile.
# Usage: cuda_resource_usage.sh "ARCH..." MAX_REGISTERS "UNIT.cu=MAX ..." OBJECT...
set -euo pipefail
ARCHS=$1 MAX_REGISTERS=$2 OVERRIDES=$3
shift 3
objects=()
for arg in "$@"; do  # $<TARGET_OBJECTS> may arrive as one ;-list
  IFS=';' read -ra parts <<<"$arg"
  objects+=("${parts[@]}")
done
[ ${#objects[@]} -gt 0 ] || { echo "FAILED: no CUDA objects given"; exit 1; }
status=0
for object in "${objects[@]}"; do
  report=$object.resource-usage.txt
  unit=$(basename "$object" .o)  # plan_kernels.cu
  if [ ! -s "$report" ]; then
    echo "FAILED: $report is missing or empty: the build compiles $unit with --resource-usage through" \
         "cmake/ptxas_report_launcher.sh; rebuild the target topoccl_kernels_cuda"
    status=1
    continue
  fi
  limit=$MAX_REGISTERS
  for override in $OVERRIDES; do [ "${override%%=*}" = "$unit" ] && limit=${override#*=}; done
  for arch in $ARCHS; do
    # Each function's lines follow its "Compiling entry function '...' for 'sm_NN'" line; keep those of this arch.
    lines=$(awk -v want="'sm_$arch'" '
      /Compiling entry function/ { keep = ($NF == want) }
      keep' "$report")
    kernels=$(grep -c "Compiling entry function" <<<"$lines" || true)
    clean=$(grep -c "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" <<<"$lines" || true)
    worst=$(grep -o "Used [0-9]* registers" <<<"$lines" | awk '{print $2}' | sort -n | tail -1 || true)
    echo "sm_$arch $unit: $kernels kernels, $clean without stack or spills, at most ${worst:-0} registers (limit $limit)"
    if [ "$kernels" -eq 0 ] || [ "$clean" -ne "$kernels" ] || [ "${worst:-0}" -gt "$limit" ]; then
      # The kernels at fault: a stack frame or spills, or registers over the limit.
      awk -v limit="$limit" '
        /Compiling entry function/ { name = $(NF - 2) }
        /bytes stack frame/ && !/^ +0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads/ { print "  " name ":" $0 }
        /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used" && $(i + 1) + 0 > limit) print "  " name ": " $(i + 1) " registers" }
      ' <<<"$lines"
      status=1
    fi
  done
done
[ "$status" = 0 ] && echo "resource usage: PASSED" || echo "resource usage: FAILED"
exit "$status"

#!/usr/bin/env bash
# Compiles the CUDA kernels with `nvcc --resource-usage` for each GPU architecture and fails unless every
# kernel has no stack frame, no spills (no local memory in the hot loops) and at most MAX_REGISTERS
# registers. Needs nvcc only, no GPU.
# Usage: cuda_resource_usage.sh NVCC SRC_DIR "ARCH..." [MAX_REGISTERS] ["UNIT.cu=MAX ..."]
set -euo pipefail
NVCC=$1 SRC=$2 ARCHS=$3 MAX_REGISTERS=${4:-64} OVERRIDES=${5:-}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
for arch in $ARCHS; do
  for unit in "$SRC"/kernels/cuda/*.cu; do
    "$NVCC" -std=c++17 -arch="sm_$arch" --resource-usage -I"$SRC" -c "$unit" -o /dev/null >"$out" 2>&1 ||
      { cat "$out"; echo "FAILED: nvcc could not compile $unit for sm_$arch"; exit 1; }
    kernels=$(grep -c "Compiling entry function" "$out" || true)
    clean=$(grep -c "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" "$out" || true)
    worst=$(grep -o "Used [0-9]* registers" "$out" | awk '{print $2}' | sort -n | tail -1)
    limit=$MAX_REGISTERS
    for override in $OVERRIDES; do [ "${override%%=*}" = "$(basename "$unit")" ] && limit=${override#*=}; done
    echo "sm_$arch $(basename "$unit"): $kernels kernels, $clean without stack or spills, at most ${worst:-0} registers (limit $limit)"
    if [ "$kernels" -eq 0 ] || [ "$clean" -ne "$kernels" ] || [ "${worst:-0}" -gt "$limit" ]; then
      grep -B2 -E "bytes stack frame" "$out" | grep -v "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" || true
      status=1
    fi
  done
done
[ "$status" = 0 ] && echo "resource usage: PASSED" || echo "resource usage: FAILED"
exit "$status"

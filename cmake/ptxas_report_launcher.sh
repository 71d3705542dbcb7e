#!/usr/bin/env bash
# CUDA_COMPILER_LAUNCHER of topoccl_kernels_cuda, whose units compile with --resource-usage: runs the compile,
# keeps ptxas's per-kernel report in OBJECT.resource-usage.txt next to the object it describes, and passes every
# other line through. tests/kernels/cuda_resource_usage.sh reads those reports instead of compiling the kernels
# a second time (about 3 minutes of one core per architecture list, most of CI's test time).
#   ptxas_report_launcher.sh COMPILER ARGS...
set -uo pipefail
object=""
compiles=0
previous=""
for arg in "$@"; do
  [ "$previous" = "-o" ] && object=$arg
  [ "$arg" = "-c" ] && compiles=1
  previous=$arg
done
output=$(mktemp)
trap 'rm -f "$output"' EXIT
"$@" >"$output" 2>&1
status=$?
# ptxas's lines: "ptxas info : ..." and the indented "N bytes stack frame, ..." line of each function.
report='^ptxas info|^ +[0-9]+ bytes stack frame'
grep -Ev "$report" "$output" >&2
if [ "$compiles" = 1 ] && [ -n "$object" ]; then
  if [ "$status" = 0 ]; then
    grep -E "$report" "$output" >"$object.resource-usage.txt" || true
  else
    rm -f "$object.resource-usage.txt"
  fi
fi
exit "$status"

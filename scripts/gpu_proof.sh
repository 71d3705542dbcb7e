#!/usr/bin/env bash
# Issue 7's proof on a machine with a GPU, from the bundle scripts/gpu_bundle.sh made (.gpu/, which holds a
# copy of this script): the GPU tests, the benchmarks on GPU buffers (2 and 4 ranks sharing the GPU, and 1),
# and PyTorch on topoccl's libnccl.so.2 (and NVIDIA's NCCL at 1 rank for comparison). Logs go to $OUT (the
# device tool's folder; at most 8 files) or .gpu/out. Usage, from the repository root on that machine:
#   bash .gpu/gpu_proof.sh
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi -L || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
} >"$OUT/device.txt" 2>&1

{
  for t in test_gpu_kernels test_gpu_plans test_gpu_collectives; do
    echo "== $t"
    timeout 900 "bin/$t"
    echo "== $t: exit $?"
  done
} 2>&1 | tee "$OUT/gpu_tests.log"

{
  for n in 2 4 1; do
    for p in all_reduce all_gather reduce_scatter alltoall broadcast; do
      echo "== ${p}_perf --gpu -g $n"
      timeout 300 "bin/${p}_perf" --gpu -g "$n" -b 8 -e 1G -f 4 -n 20 -w 5 -c 1
    done
  done
} 2>&1 | tee "$OUT/perf_gpu.log"

{
  echo "== topoccl, 2 processes on GPU 0"
  LD_PRELOAD=$PWD/lib/libnccl.so.2 timeout 600 python3 torch_nccl.py --bench
  echo "== topoccl, 1 process"
  LD_PRELOAD=$PWD/lib/libnccl.so.2 timeout 300 python3 torch_nccl.py --bench --world 1
  echo "== NVIDIA NCCL, 1 process"
  timeout 300 python3 torch_nccl.py --bench --world 1
} 2>&1 | tee "$OUT/torch.log"
grep -h -E "PASSED|FAILED|skipped" "$OUT"/*.log

#!/usr/bin/env bash
# Issue 7's proof on a machine with a GPU, from the bundle scripts/gpu_bundle.sh made (.gpu/, which holds a
# copy of this script): the GPU tests, the kernels' bandwidth against the device's copy, the benchmarks on GPU
# buffers (1, 2 and 4 ranks sharing the GPU), and PyTorch on topoccl's libnccl.so.2 (and NVIDIA's NCCL at 1
# rank beside it). Device time is scarce: every step has a timeout and the whole run a budget
# (PROOF_SECONDS, default 330); steps that would start past it are skipped and say so. Logs go to $OUT (the
# device tool's folder; at most 8 files come back) or .gpu/out. Usage, from the repository root there:
#   bash .gpu/gpu_proof.sh [steps...]     steps: info p2p p2p-kernel p2p-threads staged kernels bandwidth plans
#                                                coll-threads torch
#                                                coll-processes fusion torch-bench perf nccl-tests lanes stall proto
#                                                alltoall wide tune mps
#                                                (default: all, in order)
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
budget=${PROOF_SECONDS:-330}
begin=$(date +%s)
summary=$OUT/summary.txt
: >"$summary"

# step NAME TIMEOUT LOG COMMAND...: runs COMMAND with the smaller of TIMEOUT and what is left of the budget.
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((budget - ($(date +%s) - begin)))
  if [ "$left" -lt 10 ]; then
    echo "$name: skipped (budget of ${budget}s spent)" | tee -a "$summary"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  echo "== $name (timeout ${limit}s): $*" >>"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - t0))s" >>"$log"
  echo "$name: exit $rc after $(($(date +%s) - t0))s" | tee -a "$summary"
}

# PyTorch's own CUDA runtime first: the preloaded libnccl.so.2 then binds to the libcudart torch uses.
torch_cudart=$(python3 -c "import glob, os, torch; d = os.path.dirname(os.path.dirname(torch.__file__)); \
print(os.path.dirname((glob.glob(d + '/nvidia/**/libcudart.so.13*', recursive=True) + [''])[0]))" 2>/dev/null)
torch_env=(env "LD_LIBRARY_PATH=${torch_cudart:+$torch_cudart:}$LD_LIBRARY_PATH" "LD_PRELOAD=$PWD/lib/libnccl.so.2")

want() { [ ${#steps[@]} -eq 0 ] || [[ " ${steps[*]} " == *" $1 "* ]]; }
steps=("$@")

if want info; then
  {
    date -u
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,compute_mode --format=csv
    nproc
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
    lib=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cuda.so'))")
    echo "nccl symbols libtorch_cuda.so needs:"
    nm -D --undefined-only "$lib" 2>/dev/null | grep -i nccl | tr -s ' ' | tr '\n' ' '
    echo
    readelf -d "$lib" 2>/dev/null | grep -E "NEEDED.*nccl|FLAGS"
    echo "missing from topoccl's libnccl.so.2:"
    nm -D --defined-only lib/libnccl.so.2 | awk '{print $3}' | sort >/tmp/ours.txt
    nm -D --undefined-only "$lib" | awk '{print $2}' | grep -E '^nccl' | sort | comm -23 - /tmp/ours.txt
    echo "torch cudart dir: $torch_cudart"
    ldd bin/test_gpu_plans | grep -E "cudart|not found"
  } >"$OUT/device.txt" 2>&1
fi

# Point-to-point on GPU buffers and collectives staged through host memory (the host proxy; NCCL_HOSTID makes
# processes of this one machine different hosts, so their bytes go over TCP).
want p2p && step p2p 120 "$OUT/staged.log" bin/test_gpu_collectives p2p
if want p2p-kernel; then
  # Sends and receives in the plan kernel through the GPU FIFOs (TOPOCCL_GPU_P2P=kernel; auto picks it for ranks on
  # GPUs of their own, or processes under MPS): checked, then timed against the staged path above.
  step p2p-kernel 150 "$OUT/p2p.log" bin/test_gpu_collectives p2p-kernel
  export TOPOCCL_TIMEOUT_MS=20000
  for n in 2 4; do
    step "sendrecv_perf -g $n, TOPOCCL_GPU_P2P=kernel" 45 "$OUT/p2p.log" env TOPOCCL_GPU_P2P=kernel NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      bin/sendrecv_perf --gpu -g "$n" -b 8 -e 512M -f 8 -n 20 -w 5 -c 1
  done
  step "alltoallv_perf -g 2 -u 1, TOPOCCL_GPU_P2P=kernel" 45 "$OUT/p2p.log" env TOPOCCL_GPU_P2P=kernel \
    bin/alltoallv_perf --gpu -g 2 -b 8 -e 64M -f 8 -n 10 -w 2 -c 1 -u 1 -d all
  unset TOPOCCL_TIMEOUT_MS
  grep -h -o -E "(run in the plan kernel|go through host memory).*" "$OUT/p2p.log" | sort | uniq -c | tee -a "$summary"
  grep -h -E "^== sendrecv|^ +(8|32768|2097152|134217728|536870912) |Avg bus" "$OUT/p2p.log" | tee -a "$summary"
fi
if want p2p-threads; then
  # Ranks that are threads, each issuing its own calls, with sends in the plan kernel forced: their launches are not
  # ordered as collectives' are (launch_order.hpp), which is why auto stages them. Probes one shared hardware queue.
  for i in 1 2; do
    step "p2p-kernel, CUDA_DEVICE_MAX_CONNECTIONS=1, run $i" 45 "$OUT/p2p-threads.log" env CUDA_DEVICE_MAX_CONNECTIONS=1 \
      bin/test_gpu_collectives p2p-kernel
  done
  for c in 8 1; do
    step "sendrecv_perf -t 2, TOPOCCL_GPU_P2P=kernel, CUDA_DEVICE_MAX_CONNECTIONS=$c" 40 "$OUT/p2p-threads.log" \
      env CUDA_DEVICE_MAX_CONNECTIONS=$c TOPOCCL_GPU_P2P=kernel TOPOCCL_TIMEOUT_MS=10000 \
      bin/sendrecv_perf --gpu -t 2 -b 8 -e 256M -f 8 -n 20 -w 5 -c 1
  done
  grep -h -E "failures|PASSED|FAILED|Avg bus" "$OUT/p2p-threads.log" | tee -a "$summary"
fi
want staged && step staged 180 "$OUT/staged.log" bin/test_gpu_collectives staged
want kernels && step kernels 90 "$OUT/tests.log" bin/test_gpu_kernels
want bandwidth && step bandwidth 40 "$OUT/perf.log" bin/gpu_kernel_bandwidth --bytes 1073741824 --repeats 20
want plans && step plans 150 "$OUT/tests.log" bin/test_gpu_plans
want coll-threads && step coll-threads 90 "$OUT/collectives.log" bin/test_gpu_collectives threads
want torch && step torch 150 "$OUT/torch.log" "${torch_env[@]}" TOPOCCL_TEST_STACKS_AFTER=90 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P python3 torch_nccl.py
want coll-processes && step coll-processes 90 "$OUT/collectives.log" bin/test_gpu_collectives processes
if want fusion; then
  # Groups of 16 all-reduces, fused into one launch and not (TOPOCCL_GPU_FUSE_GROUPS), timed and checked; the
  # COLL log counts the fused launches.
  step fusion 90 "$OUT/fusion.log" env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL bin/test_gpu_collectives fusion
  echo "fused launches logged: $(grep -c 'fused into one launch' "$OUT/fusion.log")" | tee -a "$summary"
  grep -h "per group" "$OUT/fusion.log" | tee -a "$summary"
fi
if want torch-bench; then
  step "torch bench topoccl 2 processes" 120 "$OUT/torch.log" "${torch_env[@]}" python3 torch_nccl.py --bench
  step "torch bench topoccl 1 process" 60 "$OUT/torch.log" "${torch_env[@]}" python3 torch_nccl.py --bench --world 1
  step "torch bench NVIDIA NCCL 1 process" 60 "$OUT/torch.log" python3 torch_nccl.py --bench --world 1
fi
if want mps; then
  # Processes sharing one GPU: without MPS the GPU time-slices between their contexts and each FIFO hand-off waits
  # for a slice (milliseconds a call; the GPU path warns at set-up). Under an MPS daemon their kernels run at once.
  if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/topoccl-mps CUDA_MPS_LOG_DIRECTORY=/tmp/topoccl-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d >>"$OUT/mps.log" 2>&1 && echo "MPS daemon started" | tee -a "$summary"
    step "mps: test_gpu_collectives processes" 60 "$OUT/mps.log" bin/test_gpu_collectives processes
    step "mps: torch" 90 "$OUT/mps.log" "${torch_env[@]}" NCCL_DEBUG=WARN python3 torch_nccl.py
    step "mps: torch bench topoccl 2 processes" 90 "$OUT/mps.log" "${torch_env[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT python3 torch_nccl.py --bench
    # The same with sends and receives through host memory, as before they ran in the plan kernel.
    [ -n "${MPS_STAGED:-}" ] && step "mps: torch bench topoccl 2 processes, TOPOCCL_GPU_P2P=staged" 90 "$OUT/mps-staged.log" \
      "${torch_env[@]}" TOPOCCL_GPU_P2P=staged python3 torch_nccl.py --bench
    echo quit | nvidia-cuda-mps-control >>"$OUT/mps.log" 2>&1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    grep -h "bench world\|shares GPU\|PASSED\|FAILED\|plan kernel\|host memory" "$OUT/mps.log" | sort | uniq -c | tee -a "$summary"
    [ -f "$OUT/mps-staged.log" ] && grep -h "send/recv" "$OUT/mps-staged.log" | sed 's/^/staged: /' | tee -a "$summary"
  else
    echo "mps: skipped (no nvidia-cuda-mps-control)" | tee -a "$summary"
  fi
fi
if want perf; then
  export TOPOCCL_TIMEOUT_MS=20000  # a hang becomes an error, not a lost run
  for n in 1 2 4; do
    top=1G
    [ "$n" -eq 4 ] && top=256M  # -c 1 checks on the host: 4 ranks x 1 GiB took over a minute
    step "all_reduce_perf -g $n" 60 "$OUT/perf.log" bin/all_reduce_perf --gpu -g "$n" -b 8 -e "$top" -f 4 -n 20 -w 5 -c 1
  done
  for p in all_gather reduce_scatter alltoall broadcast; do
    step "${p}_perf -g 2" 40 "$OUT/perf.log" "bin/${p}_perf" --gpu -g 2 -b 8 -e 256M -f 8 -n 10 -w 3 -c 1
  done
  step "sendrecv_perf -g 2 (in the plan kernel: one thread issues every rank's calls)" 40 "$OUT/perf.log" \
    bin/sendrecv_perf --gpu -g 2 -b 8 -e 256M -f 8 -n 10 -w 3 -c 1
  step "sendrecv_perf -g 2 TOPOCCL_GPU_P2P=staged" 40 "$OUT/perf.log" env TOPOCCL_GPU_P2P=staged \
    bin/sendrecv_perf --gpu -g 2 -b 8 -e 256M -f 8 -n 10 -w 3 -c 1
  step "all_reduce_perf -g 2 TOPOCCL_GPU_STAGED=always" 40 "$OUT/perf.log" env TOPOCCL_GPU_STAGED=always \
    bin/all_reduce_perf --gpu -g 2 -b 8 -e 256M -f 8 -n 10 -w 3 -c 1
  unset TOPOCCL_TIMEOUT_MS
fi
if want nccl-tests; then
  # Session 30's benchmark flags and programs on GPU buffers (host-tested only before): misaligned buffers,
  # per-iteration timing, enqueue time, registration, the -T watchdog armed; alltoallv's uneven send/recv
  # group; hypercube's rounds (thread ranks: its rounds cannot share a -g group).
  export TOPOCCL_TIMEOUT_MS=20000
  step "all_reduce_perf -g 2 -u 3 -I 1 -K 2 -S 1 -R 1 -T 15" 40 "$OUT/perf.log" bin/all_reduce_perf --gpu -g 2 -b 7 -e 64M -f 9 \
    -n 10 -w 2 -c 1 -u 3 -I 1 -K 2 -S 1 -R 1 -T 15
  step "all_gather_perf -g 2 -C 1 -R 2" 30 "$OUT/perf.log" bin/all_gather_perf --gpu -g 2 -b 8 -e 16M -f 8 -n 10 -w 2 -c 1 -C 1 -R 2
  step "alltoallv_perf -g 2 -u 1" 40 "$OUT/perf.log" bin/alltoallv_perf --gpu -g 2 -b 8 -e 64M -f 8 -n 10 -w 2 -c 1 -u 1 -d all
  for n in 2 4; do
    step "hypercube_perf -t $n" 40 "$OUT/perf.log" bin/hypercube_perf --gpu -t "$n" -b 8 -e 64M -f 8 -n 10 -w 2 -c 1
  done
  unset TOPOCCL_TIMEOUT_MS
fi
if want lanes; then
  # Lanes by call size (the default) against the former fixed 8, checked.
  for n in 2 4; do
    for v in "TOPOCCL_GPU_NCHANNELS=0" "TOPOCCL_GPU_NCHANNELS=8"; do
      step "all_reduce_perf -g $n, $v" 45 "$OUT/perf.log" env "$v" TOPOCCL_TIMEOUT_MS=20000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
        bin/all_reduce_perf --gpu -g "$n" -b 1M -e 256M -f 2 -n 10 -w 3 -c 1
    done
  done
fi
if want stall; then
  # Thread ranks sharing a GPU deadlocked when a rank's next launch got ahead of a peer's current one on a shared
  # hardware queue: on an H200 (2026-11-26) CUDA_DEVICE_MAX_CONNECTIONS=1 stalled 3 runs of 3, 32 none. Ranks now
  # enqueue in call order (TOPOCCL_GPU_LAUNCH_ORDER): with 1 connection every run must pass; with the ordering off
  # the last check shows the queue still deadlocks without it.
  for i in $(seq "${STALL_RUNS:-4}"); do
    step "stall check, CUDA_DEVICE_MAX_CONNECTIONS=1, ordered, run $i" 40 "$OUT/stall-ordered.log" env CUDA_DEVICE_MAX_CONNECTIONS=1 \
      TOPOCCL_TEST_TRACE=1 TOPOCCL_TIMEOUT_MS=10000 bin/test_gpu_collectives threads
  done
  step "stall check, CUDA_DEVICE_MAX_CONNECTIONS=1, ordered, fusion" 40 "$OUT/stall-ordered.log" env CUDA_DEVICE_MAX_CONNECTIONS=1 \
    TOPOCCL_TIMEOUT_MS=10000 bin/test_gpu_collectives fusion
  step "stall check, CUDA_DEVICE_MAX_CONNECTIONS=1, TOPOCCL_GPU_LAUNCH_ORDER=0 (expected to stall)" 25 "$OUT/stall-unordered.log" \
    env CUDA_DEVICE_MAX_CONNECTIONS=1 TOPOCCL_GPU_LAUNCH_ORDER=0 TOPOCCL_TEST_TRACE=1 TOPOCCL_TIMEOUT_MS=10000 bin/test_gpu_collectives threads
fi
if want proto; then
  # Where LL pays: each protocol alone from 8 B to 512 KiB (the default, TOPOCCL_GPU_LL_BYTES=0, is Simple throughout).
  for n in 2 4; do
    for v in "NCCL_PROTO=LL" "NCCL_PROTO=Simple"; do
      step "all_reduce_perf -g $n, $v" 30 "$OUT/perf.log" env "$v" bin/all_reduce_perf --gpu -g "$n" -b 8 -e 512K -f 4 -n 50 -w 5 -c 1
    done
  done
fi
if want alltoall; then
  # All-to-all over many lanes (a lane per peer and channel), checked, 2 and 4 ranks.
  for n in 2 4; do
    step "alltoall_perf -g $n" 40 "$OUT/perf.log" env TOPOCCL_TIMEOUT_MS=20000 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      bin/alltoall_perf --gpu -g "$n" -b 8 -e 256M -f 8 -n 10 -w 3 -c 1
  done
fi
if want wide; then
  # 32 lanes, checked: the setting that timed 3-4x the default's bandwidth (2026-11-26) but was not checked then.
  for n in 2 4; do
    step "all_reduce_perf -g $n, 32 lanes" 45 "$OUT/perf.log" env TOPOCCL_GPU_NCHANNELS=32 TOPOCCL_TIMEOUT_MS=20000 \
      bin/all_reduce_perf --gpu -g "$n" -b 1M -e 256M -f 4 -n 10 -w 3 -c 1
  done
fi
if want tune; then
  # Lanes and threads per lane of the GPU path's rings, large all-reduce only (no checks: timing).
  for v in "TOPOCCL_GPU_NCHANNELS=4" "TOPOCCL_GPU_NCHANNELS=16" "TOPOCCL_GPU_NCHANNELS=32" "TOPOCCL_GPU_THREADS=256"; do
    step "tune $v" 30 "$OUT/perf.log" env "$v" bin/all_reduce_perf --gpu -g 2 -b 16M -e 1G -f 8 -n 20 -w 5 -c 0
  done
fi
echo "total $(($(date +%s) - begin))s" | tee -a "$summary"
grep -h -E "PASSED|FAILED|skipped|worst|busbw [0-9]" "$OUT"/*.log | head -60

#!/usr/bin/env bash
# Packs what the GPU proof needs into .gpu/ (git-ignored) for a machine with a GPU but no Debian packages or
# network (the `device` tool's machines): the GPU tests, the benchmarks and libnccl.so.2 built here without
# MPI, verbs or hwloc, the shared libraries they need that such a machine lacks, the PyTorch check, and
# scripts/gpu_proof.sh, which runs it all there. Usage: scripts/gpu_bundle.sh   (then carry .gpu-pack)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu-bundle}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc >/dev/null || { echo "gpu_bundle: nvcc not found: the bundle needs the CUDA kernels" >&2; exit 1; }
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DTOPOCCL_CUDA=ON -DTOPOCCL_MPI=OFF -DTOPOCCL_IBVERBS=OFF \
      -DTOPOCCL_HWLOC=OFF -DTOPOCCL_BUILD_TESTS=ON >"$BUILD_DIR.configure.log"
targets=(nccl_shared test_gpu_kernels test_gpu_plans test_gpu_collectives
         all_reduce_perf all_gather_perf reduce_scatter_perf alltoall_perf broadcast_perf sendrecv_perf alltoallv_perf
         hypercube_perf gpu_kernel_bandwidth)
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}"
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for t in test_gpu_kernels test_gpu_plans test_gpu_collectives; do cp "$BUILD_DIR/tests/$t" .gpu/bin/; done
for p in all_reduce all_gather reduce_scatter alltoall broadcast sendrecv alltoallv hypercube; do cp "$BUILD_DIR/perf/${p}_perf" .gpu/bin/; done
cp "$BUILD_DIR/perf/gpu_kernel_bandwidth" .gpu/bin/
cp -L "$(find "$BUILD_DIR" -name libnccl.so.2 | head -1)" .gpu/lib/libnccl.so.2
# Libraries the target image is not known to have: everything but the C/C++ runtime (cudart too: the image's
# may not be on the loader's path; this nvcc's matches the driver there, CUDA 13).
for f in .gpu/bin/* .gpu/lib/libnccl.so.2; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
cp tests/gpu/torch_nccl.py scripts/gpu_proof.sh .gpu/
strip --strip-unneeded .gpu/bin/* .gpu/lib/libnccl.so.2
# The device tool carries at most 64 MiB with the working tree (.git included): the bundle goes compressed.
rm -rf .gpu-pack && mkdir -p .gpu-pack && tar cJf .gpu-pack/gpu.tar.xz .gpu
du -sh .gpu .gpu-pack
echo "gpu_bundle: ready; on the GPU machine (carry .gpu-pack), from the repository root:"
echo "  python3 -c \"import tarfile; tarfile.open('.gpu-pack/gpu.tar.xz').extractall('.')\" && bash .gpu/gpu_proof.sh"
# The device tool sends the checkout, .git included, up to 64 MiB: the side by sides' results (about 43 MiB) do not
# fit beside the rest. A sparse checkout leaves them out of the tree while git still tracks them (nothing shows as
# deleted, so no commit can drop them); moving the folder aside instead nearly committed its deletion once.
echo "  if the device tool finds the tree over 64 MiB, first:  git sparse-checkout set --no-cone '/*' '!/perf/compare/results/'"
echo "  and afterwards:                                          git sparse-checkout disable"

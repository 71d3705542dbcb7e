#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on its embedded default: an application
# written against NCCL (examples/allreduce_mpi.c, linked only to libnccl.so.2) under mpirun -np 4,
# first over shared memory, then over TCP with shm disabled.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DTOPOCCL_BUILD_TESTS=OFF
BUILD_DIR=${BUILD_DIR:-build}
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np ${NP:-4}"
echo "== libnccl.so.2 from topoccl: $(readlink -f "$BUILD_DIR"/src/api/libnccl.so.2)"
echo "== all-reduce over shared memory (NCCL_DEBUG=INFO shows the transport per peer)"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT $MPIRUN -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS "$BUILD_DIR/examples/allreduce_mpi"
echo "== the same over TCP (NCCL_SHM_DISABLE=1)"
$MPIRUN -x NCCL_SHM_DISABLE=1 "$BUILD_DIR/examples/allreduce_mpi"

// How many lanes the GPU path's rings get (core/gpu_path.hpp): never more than the ranks sharing a GPU can
// keep resident together, more for larger calls, and within the FIFO memory budget. Pure functions: no GPU.
#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "core/gpu_path.hpp"

using namespace topoccl;

TEST_CASE("GPU ring lanes: the most lanes fit every rank sharing a GPU on its multiprocessors") {
  const size_t small = 1 << 20;  // FIFO bytes a lane: far within the budget
  CHECK(core::gpuMaxRingLanes(132, 1, small) == 32);  // H100, one rank: capped at 32
  CHECK(core::gpuMaxRingLanes(132, 2, small) == 32);
  CHECK(core::gpuMaxRingLanes(132, 4, small) == 32);  // 4 x 32 = 128 blocks on 132 multiprocessors
  CHECK(core::gpuMaxRingLanes(132, 5, small) == 16);  // 26 -> a power of two
  CHECK(core::gpuMaxRingLanes(132, 8, small) == 16);
  CHECK(core::gpuMaxRingLanes(108, 8, small) == 8);   // A100
  CHECK(core::gpuMaxRingLanes(6, 8, small) == 1);     // fewer multiprocessors than ranks: one lane each
  CHECK(core::gpuMaxRingLanes(0, 2, small) == 1);     // unknown GPU
  for (int mp : {1, 7, 46, 80, 108, 132, 144})
    for (int ranks = 1; ranks <= 12; ++ranks) {
      const int lanes = core::gpuMaxRingLanes(mp, ranks, small);
      INFO(mp << " multiprocessors, " << ranks << " ranks: " << lanes << " lanes");
      CHECK(lanes >= 1);
      CHECK(lanes <= 32);
      CHECK((lanes & (lanes - 1)) == 0);
      CHECK((lanes * ranks <= mp || lanes == 1));
    }
}

TEST_CASE("GPU ring lanes: above 8, the receiving FIFOs stay within their memory budget") {
  const size_t perLane = core::kGpuFifoBudgetBytes / 10;  // 10 lanes' worth fit
  CHECK(core::gpuMaxRingLanes(132, 1, perLane) == 8);
  CHECK(core::gpuMaxRingLanes(132, 1, core::kGpuFifoBudgetBytes / 32) == 32);
  CHECK(core::gpuMaxRingLanes(132, 1, core::kGpuFifoBudgetBytes / 31) == 16);
  CHECK(core::gpuMaxRingLanes(132, 1, core::kGpuFifoBudgetBytes) == 8);  // 8 always (the former fixed count)
  CHECK(core::gpuMaxRingLanes(132, 32, core::kGpuFifoBudgetBytes) == 4);  // residency still rules below 8
  // The default geometry: 8 slots of 128 KiB and LL lines for 2-4 ranks, 2 x ranks slots from 5.
  const kernels::DeviceFifoGeometry g2 = core::gpuFifoGeometry(2), g8 = core::gpuFifoGeometry(8);
  CHECK(g2.slotCount == 8);
  CHECK(g8.slotCount == 16);
  CHECK(g2.slotBytes == 128 << 10);
}

TEST_CASE("GPU ring lanes: a call gets a lane per 256 KiB of each rank's share, 8 up to the most") {
  const size_t KiB = 1024, MiB = KiB * KiB;
  CHECK(core::gpuRingLanes(256 * KiB, 2, 32) == 8);  // the smallest ring call
  CHECK(core::gpuRingLanes(4 * MiB, 2, 32) == 8);
  CHECK(core::gpuRingLanes(8 * MiB, 2, 32) == 16);
  CHECK(core::gpuRingLanes(16 * MiB, 2, 32) == 32);
  CHECK(core::gpuRingLanes(16 * MiB, 4, 32) == 16);
  CHECK(core::gpuRingLanes(12 * MiB, 2, 32) == 16);  // 24 -> a power of two
  CHECK(core::gpuRingLanes(size_t{1} << 40, 2, 32) == 32);
  CHECK(core::gpuRingLanes(size_t{1} << 40, 2, 16) == 16);
  CHECK(core::gpuRingLanes(256 * KiB, 2, 4) == 4);  // fewer may be resident than 8
  CHECK(core::gpuRingLanes(0, 3, 1) == 1);
  size_t previous = 0;
  for (size_t bytes = 256 * KiB; bytes <= 2048 * MiB; bytes = bytes * 3 / 2) {  // grows with the call
    const int lanes = core::gpuRingLanes(bytes, 3, 32);
    CHECK(static_cast<size_t>(lanes) >= previous);
    previous = static_cast<size_t>(lanes);
  }
  CHECK(previous == 32);
}

TEST_CASE("GPU sends and receives: a group with every peer both ways fits the resident lanes, or is staged") {
  CHECK(core::gpuPointToPointMaxLanes(2, 32) == 8);   // 3 connections: 10 -> 8 lanes a message
  CHECK(core::gpuPointToPointMaxLanes(4, 32) == 4);   // 7 connections
  CHECK(core::gpuPointToPointMaxLanes(1, 32) == 32);  // self copies only
  CHECK(core::gpuPointToPointMaxLanes(8, 16) == 1);   // 15 connections on 16 lanes
  CHECK(core::gpuPointToPointMaxLanes(9, 16) == 0);   // 17 would not all be resident
  CHECK(core::gpuPointToPointMaxLanes(2, 1000) == 16);  // the kernel runs at most 64 lanes
  CHECK(core::gpuPointToPointMaxLanes(33, 64) == 0);
  for (int n = 1; n <= 40; ++n)
    for (int resident : {1, 4, 8, 16, 32, 64}) {
      const uint32_t lanes = core::gpuPointToPointMaxLanes(n, resident);
      INFO(n << " ranks, " << resident << " resident lanes: " << lanes);
      CHECK((lanes & (lanes - (lanes > 0 ? 1 : 0))) == 0);  // 0 or a power of two
      if (lanes > 0) CHECK(static_cast<int>(lanes) * (2 * n - 1) <= resident);
      else CHECK(2 * n - 1 > resident);
    }
}

TEST_CASE("GPU sends and receives: auto stages them where ranks share a GPU unsafely, kernel and staged force") {
  core::GpuPointToPointPlacement own;  // every rank on a GPU of its own
  own.nranks = 2;
  own.maxLanes = 32;
  CHECK(core::gpuPointToPointLanes("auto", own, false) == 8);
  CHECK(core::gpuPointToPointLanes("staged", own, true) == 0);
  core::GpuPointToPointPlacement threads = own;
  threads.threadsShareGpu = true;
  CHECK(core::gpuPointToPointLanes("auto", threads, false) == 0);  // each thread issues its own calls
  CHECK(core::gpuPointToPointLanes("auto", threads, true) == 8);   // one thread issues every rank's (-g)
  CHECK(core::gpuPointToPointLanes("kernel", threads, false) == 8);
  core::GpuPointToPointPlacement processes = own;
  processes.processesShareGpuWithoutMps = true;
  CHECK(core::gpuPointToPointLanes("auto", processes, true) == 0);
  CHECK(core::gpuPointToPointLanes("kernel", processes, false) == 8);
  core::GpuPointToPointPlacement many = own;
  many.nranks = 40;
  CHECK(core::gpuPointToPointLanes("kernel", many, true) == 0);  // could not all be resident: staged even when forced
  try {
    core::gpuPointToPointLanes("fast", own, false);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("TOPOCCL_GPU_P2P=fast must be auto, kernel or staged"));
  }
}

// The CUDA reduction and copy kernels on a real GPU, against the independent host reference: every type x
// op, sizes from 1 element to past a MiB, operands co-aligned at several offsets (packed path) and not
// (scalar path), in place and out of place. Exits 77 (ctest: skipped) and says "skipped: no GPU" where
// there is no usable GPU, so a machine without one never reports it passed.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_reduce.hpp"
#include "kernels/host_reduce.hpp"
#include "../kernels/reference.hpp"
#include "gpu_support.hpp"

using namespace topoccl;
using namespace topoccl::kernels;
using namespace topoccl::kernels::test;

namespace {


// A device allocation with room to place data at any offset below 16 bytes.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { ok(cudaMalloc(&base, bytes + 64), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(base); }
  unsigned char* at(size_t offset) const { return static_cast<unsigned char*>(base) + offset; }
  void* base = nullptr;
};

void checkReduce(DataType type, ReduceOp op, size_t count, size_t dstOffset, size_t bOffset, bool inPlace, TestRng& rng) {
  const ReferenceType ref(type);
  const size_t bytes = count * ref.size();
  std::vector<unsigned char> a(bytes), b(bytes), got(bytes);
  ref.fillRandom(a.data(), count, rng);
  ref.fillRandom(b.data(), count, rng);
  DeviceBuffer da(bytes), db(bytes), dd(bytes);
  unsigned char* aDev = da.at(dstOffset);
  unsigned char* bDev = db.at(bOffset);
  unsigned char* dstDev = inPlace ? aDev : dd.at(dstOffset);
  if (!ok(cudaMemcpy(aDev, a.data(), bytes, cudaMemcpyHostToDevice), "copy a") ||
      !ok(cudaMemcpy(bDev, b.data(), bytes, cudaMemcpyHostToDevice), "copy b") ||
      !ok(launchReduce(type, op, dstDev, aDev, bDev, count, nullptr), "launchReduce") ||
      !ok(cudaDeviceSynchronize(), "kernel") ||
      !ok(cudaMemcpy(got.data(), dstDev, bytes, cudaMemcpyDeviceToHost), "copy result"))
    return;
  std::string first;
  const size_t wrong = countMismatches(ref, op, a.data(), b.data(), got.data(), count, first);
  if (wrong > 0)
    fail(std::string(ref.name()) + " " + reduceOpName(op) + " count " + std::to_string(count) + " dst offset " +
         std::to_string(dstOffset) + " b offset " + std::to_string(bOffset) + (inPlace ? " in place" : "") + ": " +
         std::to_string(wrong) + " wrong; first: " + first);
}

void checkCopy(size_t bytes, size_t srcOffset, size_t dstOffset, TestRng& rng) {
  std::vector<unsigned char> src(bytes), got(bytes);
  for (auto& byte : src) byte = static_cast<unsigned char>(rng());
  DeviceBuffer ds(bytes), dd(bytes);
  if (!ok(cudaMemcpy(ds.at(srcOffset), src.data(), bytes, cudaMemcpyHostToDevice), "copy src") ||
      !ok(launchCopy(dd.at(dstOffset), ds.at(srcOffset), bytes, nullptr), "launchCopy") ||
      !ok(cudaDeviceSynchronize(), "kernel") ||
      !ok(cudaMemcpy(got.data(), dd.at(dstOffset), bytes, cudaMemcpyDeviceToHost), "copy result"))
    return;
  if (std::memcmp(got.data(), src.data(), bytes) != 0)
    fail("launchCopy of " + std::to_string(bytes) + " bytes, src offset " + std::to_string(srcOffset) + ", dst offset " +
         std::to_string(dstOffset));
}

// launchScale (host and device scalar) and launchDivide against the host's hostScale / hostDivide, which the
// host tests hold to the reference: the GPU's Avg and PreMulSum round exactly as the host's.
void checkScaleDivide(DataType type, size_t count, TestRng& rng) {
  const ReferenceType ref(type);
  const size_t bytes = count * ref.size();
  std::vector<unsigned char> src(bytes), want(bytes), got(bytes);
  ref.fillRandom(src.data(), count, rng);
  unsigned char scalar[8] = {};
  ref.fillRandom(scalar, 1, rng);
  DeviceBuffer ds(bytes), dd(bytes), dscalar(8);
  if (!ok(cudaMemcpy(ds.at(0), src.data(), bytes, cudaMemcpyHostToDevice), "copy src") ||
      !ok(cudaMemcpy(dscalar.at(0), scalar, 8, cudaMemcpyHostToDevice), "copy scalar"))
    return;
  hostScale(type, want.data(), src.data(), count, scalar);
  for (bool onDevice : {false, true}) {
    if (!ok(launchScale(type, dd.at(0), ds.at(0), count, onDevice ? nullptr : scalar, onDevice ? dscalar.at(0) : nullptr, nullptr),
            "launchScale") ||
        !ok(cudaDeviceSynchronize(), "scale kernel") || !ok(cudaMemcpy(got.data(), dd.at(0), bytes, cudaMemcpyDeviceToHost), "copy result"))
      return;
    for (size_t i = 0; i < count; ++i) {
      const uint64_t w = ref.bitsAt(want.data(), i), g = ref.bitsAt(got.data(), i);
      if (w != g && !(ref.isNan(w) && ref.isNan(g))) {
        fail(std::string(ref.name()) + " launchScale of " + std::to_string(count) + (onDevice ? ", device scalar" : ", host scalar") +
             ": element " + std::to_string(i) + " is " + ref.describe(g) + ", want " + ref.describe(w));
        break;
      }
    }
  }
  if (!ref.isInteger()) {
    if (launchDivide(type, dd.at(0), ds.at(0), count, 3, nullptr) != cudaErrorInvalidValue)
      fail(std::string(ref.name()) + ": launchDivide accepted a floating type");
    cudaGetLastError();
    return;
  }
  for (uint64_t divisor : {uint64_t{3}, uint64_t{128}, ~uint64_t{0}}) {
    hostDivide(type, want.data(), src.data(), count, divisor);
    if (!ok(launchDivide(type, dd.at(0), ds.at(0), count, divisor, nullptr), "launchDivide") || !ok(cudaDeviceSynchronize(), "divide kernel") ||
        !ok(cudaMemcpy(got.data(), dd.at(0), bytes, cudaMemcpyDeviceToHost), "copy result"))
      return;
    if (std::memcmp(got.data(), want.data(), bytes) != 0)
      fail(std::string(ref.name()) + " launchDivide of " + std::to_string(count) + " by " + std::to_string(divisor) + " differs from hostDivide");
  }
}

}  // namespace

int main() {
  int devices = 0;
  const std::optional<uint64_t> seed = startGpuTest(&devices);
  if (!seed) return kSkipped;
  TestRng rng(*seed);
  size_t cases = 0;
  for (DataType type : allDataTypes()) {
    const size_t es = ReferenceType(type).size();
    for (ReduceOp op : kKernelOps) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{(1 << 20) + 3}}) {
        for (size_t offset = 0; offset < 16; offset += es * (es == 1 ? 5 : 1)) {
          checkReduce(type, op, count, offset, offset, false, rng);             // packed
          checkReduce(type, op, count, offset, (offset + es) % 16, false, rng);  // scalar
          cases += 2;
        }
        checkReduce(type, op, count, 0, 0, true, rng);
        ++cases;
      }
    }
  }
  for (DataType type : allDataTypes())
    for (size_t count : {size_t{1}, size_t{4099}, size_t{(1 << 20) + 3}}) {
      checkScaleDivide(type, count, rng);
      ++cases;
    }
  for (size_t bytes : {size_t{1}, size_t{17}, size_t{4099}, size_t{(1 << 24) + 5}})
    for (size_t srcOffset : {0, 3, 8})
      for (size_t dstOffset : {srcOffset, (srcOffset + 1) % 16}) {
        checkCopy(bytes, srcOffset, dstOffset, rng);
        ++cases;
      }
  std::printf("%zu cases on %d GPU(s): %s\n", cases, devices, failures == 0 ? "gpu kernels: PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}

#include "api/collective_matrix.hpp"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/datatype.hpp"
#include "kernels/host_reduce.hpp"

namespace topoccl::test {
namespace {

using kernels::loadAsDouble;
using kernels::storeFromDouble;

enum class Coll { AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, Gather, Scatter };
const char* collName(Coll c) {
  static const char* names[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                "Reduce",    "AlltoAll",  "Gather",        "Scatter"};
  return names[static_cast<int>(c)];
}
bool reduces(Coll c) { return c == Coll::AllReduce || c == Coll::ReduceScatter || c == Coll::Reduce; }
bool rooted(Coll c) { return c == Coll::Broadcast || c == Coll::Reduce || c == Coll::Gather || c == Coll::Scatter; }

// Elements of a rank's input / output for per-rank count n.
size_t inputElems(Coll c, size_t n, int nranks) {
  return (c == Coll::ReduceScatter || c == Coll::AllToAll || c == Coll::Scatter) ? n * nranks : n;
}
size_t outputElems(Coll c, size_t n, int nranks) {
  return (c == Coll::AllGather || c == Coll::AllToAll || c == Coll::Gather) ? n * nranks : n;
}

double typeEpsilon(DataType t) {
  switch (t) {
    case DataType::Float16: return std::ldexp(1.0, -10);
    case DataType::Bfloat16: return std::ldexp(1.0, -7);
    case DataType::Float8e4m3: return std::ldexp(1.0, -3);
    case DataType::Float8e5m2: return std::ldexp(1.0, -2);
    case DataType::Float32: return std::ldexp(1.0, -23);
    case DataType::Float64: return std::ldexp(1.0, -52);
    default: return 0;
  }
}

// Smallest positive step of the type: rounding near zero can lose up to this much per operation.
double smallestStep(DataType t) {
  switch (t) {
    case DataType::Float16: return std::ldexp(1.0, -24);
    case DataType::Bfloat16: return std::ldexp(1.0, -133);
    case DataType::Float8e4m3: return std::ldexp(1.0, -9);
    case DataType::Float8e5m2: return std::ldexp(1.0, -16);
    case DataType::Float32: return std::ldexp(1.0, -149);
    default: return 0;
  }
}

bool isSigned(DataType t) { return t == DataType::Int8 || t == DataType::Int32 || t == DataType::Int64; }
unsigned typeBits(DataType t) { return static_cast<unsigned>(dataTypeSize(t) * 8); }

// Integer values travel as uint64 bit patterns, wrapped to the type's width like the hardware does.
uint64_t loadBits(DataType t, const void* p, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const char*>(p) + i * dataTypeSize(t), dataTypeSize(t));
  return v;
}
int64_t asSigned(DataType t, uint64_t bits) {
  const unsigned b = typeBits(t);
  if (b == 64) return static_cast<int64_t>(bits);
  const uint64_t sign = 1ull << (b - 1);
  bits &= (1ull << b) - 1;
  return static_cast<int64_t>((bits ^ sign) - sign);
}
uint64_t truncateBits(DataType t, uint64_t v) {
  const unsigned b = typeBits(t);
  return b == 64 ? v : (v & ((1ull << b) - 1));
}

// Deterministic inputs: every rank regenerates every rank's input from (seed, case, rank).
std::vector<char> makeInput(DataType t, ncclRedOp_t op, bool premul, size_t elems, uint64_t seed, int rank) {
  std::mt19937_64 gen(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1)));
  std::vector<char> data(elems * dataTypeSize(t));
  if (!isFloatingPoint(t)) {
    for (size_t i = 0; i < elems; ++i) {
      uint64_t v = gen();
      if (op == ncclAvg) v = isSigned(t) ? static_cast<uint64_t>(static_cast<int64_t>(v % 201) - 100) : v % 201;
      std::memcpy(data.data() + i * dataTypeSize(t), &v, dataTypeSize(t));
    }
    return data;
  }
  std::uniform_real_distribution<double> small(-4.0, 4.0), nearOne(0.5, 2.0);
  for (size_t i = 0; i < elems; ++i) {
    double v = (op == ncclProd && !premul) ? nearOne(gen) * ((gen() & 1) ? 1 : -1) : small(gen);
    storeFromDouble(t, data.data(), i, v);
  }
  return data;
}

std::vector<char> randomBytes(size_t bytes, uint64_t seed, int rank) {
  std::mt19937_64 gen(seed ^ (0x632be59bd9b4e019ull * static_cast<uint64_t>(rank + 7)));
  std::vector<char> data(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t word = gen();
    std::memcpy(data.data() + i, &word, std::min<size_t>(8, bytes - i));
  }
  return data;
}

struct Case {
  Coll coll;
  DataType type;
  ncclRedOp_t op;
  bool premul;       // custom PreMulSum op instead of `op`
  size_t count;
  bool inPlace;
  int root;
};

std::string describe(const Case& c, int nranks) {
  char text[256];
  std::snprintf(text, sizeof(text), "%s type=%s op=%s count=%zu %s root=%d nranks=%d", collName(c.coll),
                dataTypeName(c.type), c.premul ? "premulsum" : reduceOpName(static_cast<ReduceOp>(c.op)), c.count,
                c.inPlace ? "in-place" : "out-of-place", c.root, nranks);
  return text;
}

class Checker {
 public:
  Checker(int rank, const Case& c, int nranks, uint64_t seed) : rank_(rank), case_(c), nranks_(nranks), seed_(seed) {}

  int failures() const { return failures_; }

  void fail(size_t index, const std::string& got, const std::string& expected) {
    if (failures_++ < 5)
      std::fprintf(stderr, "rank %d FAIL %s seed=%llu: element %zu is %s, expected %s\n", rank_,
                   describe(case_, nranks_).c_str(), static_cast<unsigned long long>(seed_), index, got.c_str(),
                   expected.c_str());
  }

 private:
  int rank_;
  Case case_;
  int nranks_;
  uint64_t seed_;
  int failures_ = 0;
};

// Reference of the reduction of element `index` of each rank's input.
void checkReduced(Checker& check, const Case& c, int nranks, const std::vector<std::vector<char>>& inputs,
                  size_t inputIndex, const void* out, size_t outIndex, double premulScalar) {
  const DataType t = c.type;
  if (!isFloatingPoint(t)) {
    uint64_t acc = loadBits(t, inputs[0].data(), inputIndex);
    for (int r = 1; r < nranks; ++r) {
      const uint64_t x = loadBits(t, inputs[r].data(), inputIndex);
      switch (c.op) {
        case ncclSum:
        case ncclAvg: acc = truncateBits(t, acc + x); break;
        case ncclProd: acc = truncateBits(t, acc * x); break;
        case ncclMax:
          acc = isSigned(t) ? (asSigned(t, x) > asSigned(t, acc) ? x : acc) : (truncateBits(t, x) > truncateBits(t, acc) ? x : acc);
          break;
        case ncclMin:
          acc = isSigned(t) ? (asSigned(t, x) < asSigned(t, acc) ? x : acc) : (truncateBits(t, x) < truncateBits(t, acc) ? x : acc);
          break;
        default: break;
      }
    }
    acc = truncateBits(t, acc);
    if (c.premul) {
      uint64_t sum = 0;
      const auto s = static_cast<uint64_t>(static_cast<int64_t>(premulScalar));
      for (int r = 0; r < nranks; ++r) sum += truncateBits(t, loadBits(t, inputs[r].data(), inputIndex) * s);
      acc = truncateBits(t, sum);
    } else if (c.op == ncclAvg) {
      acc = isSigned(t) ? truncateBits(t, static_cast<uint64_t>(asSigned(t, acc) / nranks)) : truncateBits(t, acc) / nranks;
    }
    const uint64_t got = truncateBits(t, loadBits(t, out, outIndex));
    if (got != acc) check.fail(outIndex, std::to_string(got), std::to_string(acc));
    return;
  }
  double exact = 0, magnitude = 0;
  for (int r = 0; r < nranks; ++r) {
    const double x = loadAsDouble(t, inputs[r].data(), inputIndex);
    if (r == 0) {
      exact = c.premul ? x * premulScalar : x;
    } else {
      switch (c.op) {
        case ncclSum:
        case ncclAvg: exact += c.premul ? x * premulScalar : x; break;
        case ncclProd: exact *= x; break;
        case ncclMax: exact = std::max(exact, x); break;
        case ncclMin: exact = std::min(exact, x); break;
        default: break;
      }
    }
    magnitude += std::fabs(c.premul ? x * premulScalar : x);
  }
  if (c.op == ncclAvg && !c.premul) {
    exact /= nranks;
    magnitude /= nranks;
  }
  double tolerance = 0;
  if (c.op == ncclSum || c.op == ncclAvg || c.premul)
    tolerance = (nranks + 2) * (typeEpsilon(t) * magnitude + smallestStep(t));
  if (c.op == ncclProd) tolerance = (nranks + 1) * typeEpsilon(t) * std::fabs(exact);
  const double got = loadAsDouble(t, out, outIndex);
  if (!(std::fabs(got - exact) <= tolerance + 1e-300))
    check.fail(outIndex, std::to_string(got), std::to_string(exact) + " +- " + std::to_string(tolerance));
}

ncclResult_t call(const Case& c, const void* send, void* recv, ncclRedOp_t op, ncclComm_t comm) {
  const auto type = static_cast<ncclDataType_t>(c.type);
  switch (c.coll) {
    case Coll::AllReduce: return ncclAllReduce(send, recv, c.count, type, op, comm, nullptr);
    case Coll::AllGather: return ncclAllGather(send, recv, c.count, type, comm, nullptr);
    case Coll::ReduceScatter: return ncclReduceScatter(send, recv, c.count, type, op, comm, nullptr);
    case Coll::Broadcast: return ncclBroadcast(send, recv, c.count, type, c.root, comm, nullptr);
    case Coll::Reduce: return ncclReduce(send, recv, c.count, type, op, c.root, comm, nullptr);
    case Coll::AllToAll: return ncclAlltoAll(send, recv, c.count, type, comm, nullptr);
    case Coll::Gather: return ncclGather(send, recv, c.count, type, c.root, comm, nullptr);
    case Coll::Scatter: return ncclScatter(send, recv, c.count, type, c.root, comm, nullptr);
  }
  return ncclInternalError;
}

// A case's send or receive buffer: from the C heap (private to the process), or from ncclMemAlloc (shared
// memory peers can map, so the library may read and write it directly from other processes).
class CaseBuffer {
 public:
  explicit CaseBuffer(bool ncclMemory) : ncclMemory_(ncclMemory) {}
  CaseBuffer(const CaseBuffer&) = delete;
  CaseBuffer& operator=(const CaseBuffer&) = delete;
  ~CaseBuffer() { release(); }
  void assign(size_t bytes, char fill) {
    release();
    size_ = bytes;
    if (!ncclMemory_) {
      heap_.assign(bytes, fill);
      data_ = heap_.data();
    } else {
      void* p = nullptr;
      if (ncclMemAlloc(&p, bytes) != ncclSuccess || p == nullptr) throw std::bad_alloc();
      data_ = static_cast<char*>(p);
      std::memset(data_, fill, bytes);
    }
  }
  char* data() { return data_; }
  char& back() { return data_[size_ - 1]; }

 private:
  void release() {
    if (ncclMemory_ && data_) ncclMemFree(data_);
    data_ = nullptr;
  }
  bool ncclMemory_;
  std::vector<char> heap_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

// One case's buffers and reference inputs, from set-up through the call to the check, so that several cases can
// go into one group.
class PreparedCase {
 public:
  PreparedCase(int rank, int nranks, ncclComm_t comm, const Case& c, uint64_t seed, bool ncclMemory = false)
      : rank_(rank), nranks_(nranks), comm_(comm), c_(c), check_(rank, c, nranks, seed), sendBuf_(ncclMemory), recvBuf_(ncclMemory) {
    const size_t elem = dataTypeSize(c.type);
    const size_t inElems = inputElems(c.coll, c.count, nranks);
    const size_t outElems = outputElems(c.coll, c.count, nranks);
    inputs_.resize(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r)
      inputs_[r] = reduces(c.coll) ? makeInput(c.type, c.op, c.premul, inElems, seed, r) : randomBytes(inElems * elem, seed, r);

    // PreMulSum with a host-immediate scalar: a small integer keeps integer types exact.
    op_ = c.op;
    if (c.premul) {
      unsigned char scalar[8] = {};
      premulScalar_ = isFloatingPoint(c.type) ? 0.5 : 3;
      storeFromDouble(c.type, scalar, 0, premulScalar_);
      premulScalar_ = loadAsDouble(c.type, scalar, 0);
      if (ncclRedOpCreatePreMulSum(&op_, scalar, static_cast<ncclDataType_t>(c.type), ncclScalarHostImmediate, comm) !=
          ncclSuccess) {
        check_.fail(0, "ncclRedOpCreatePreMulSum failed", ncclGetLastError(nullptr));
        ready_ = false;
        return;
      }
      opCreated_ = true;
    }

    hasOutput_ = !((c.coll == Coll::Reduce || c.coll == Coll::Gather) && rank != c.root);
    const bool hasInput = !((c.coll == Coll::Broadcast || c.coll == Coll::Scatter) && rank != c.root);
    sendBuf_.assign(inElems * elem + 1, 0);
    recvBuf_.assign(outElems * elem + 1, 0);
    recvBuf_.back() = kGuard;
    send_ = sendBuf_.data();
    recv_ = recvBuf_.data();
    if (inElems > 0) std::memcpy(sendBuf_.data(), inputs_[rank].data(), inElems * elem);

    if (c.inPlace) {
      // NCCL's in-place layouts: the input lives inside the output (or the reverse).
      switch (c.coll) {
        case Coll::AllGather:
          if (inElems > 0) std::memcpy(recvBuf_.data() + rank * c.count * elem, inputs_[rank].data(), inElems * elem);
          send_ = recvBuf_.data() + rank * c.count * elem;
          break;
        case Coll::ReduceScatter:
          recv_ = sendBuf_.data() + rank * c.count * elem;
          break;
        case Coll::Gather:
          if (rank == c.root) {
            if (inElems > 0) std::memcpy(recvBuf_.data() + rank * c.count * elem, inputs_[rank].data(), inElems * elem);
            send_ = recvBuf_.data() + rank * c.count * elem;
          }
          break;
        case Coll::Scatter:
          if (rank == c.root) recv_ = sendBuf_.data() + rank * c.count * elem;
          break;
        default:
          if (hasOutput_ && inElems == outElems) {
            if (inElems > 0) std::memcpy(recvBuf_.data(), inputs_[rank].data(), inElems * elem);
            send_ = recvBuf_.data();
          }
          break;
      }
    }
    if (!hasOutput_ && c.coll == Coll::Reduce) recv_ = nullptr;  // non-roots may pass NULL
    if (!hasInput) send_ = c.inPlace ? recv_ : nullptr;
  }
  PreparedCase(const PreparedCase&) = delete;
  PreparedCase& operator=(const PreparedCase&) = delete;
  ~PreparedCase() {
    if (opCreated_) ncclRedOpDestroy(op_, comm_);
  }

  // Issues the call (inside the caller's group, if any) and returns what it returned.
  ncclResult_t issue() {
    if (!ready_) return ncclInvalidUsage;
    const ncclResult_t r = call(c_, send_, recv_, op_, comm_);
    if (r == ncclSuccess || r == ncclInProgress) return r;  // in progress: a non-blocking communicator
    check_.fail(0, std::string("call failed: ") + ncclGetLastError(nullptr), "ncclSuccess");
    ready_ = false;
    return r;
  }

  // After the call (and the group) returned: the output against the reference. Returns the failed checks.
  int check() {
    if (!ready_ || !hasOutput_) return check_.failures();
    const Case& c = c_;
    const size_t elem = dataTypeSize(c.type);
    const size_t outElems = outputElems(c.coll, c.count, nranks_);
    const char* out = static_cast<const char*>(recv_);
    if (c.inPlace && c.coll == Coll::ReduceScatter) out = sendBuf_.data() + rank_ * c.count * elem;
    if (recvBuf_.back() != kGuard) check_.fail(outElems, "overwritten guard byte", "untouched");

    auto expectBytes = [&](size_t outIndex, const std::vector<char>& src, size_t srcIndex) {
      if (std::memcmp(out + outIndex * elem, src.data() + srcIndex * elem, elem) != 0)
        check_.fail(outIndex, "different bytes", "rank input element " + std::to_string(srcIndex));
    };
    const size_t n = c.count;
    const size_t me = static_cast<size_t>(rank_);
    switch (c.coll) {
      case Coll::AllReduce:
      case Coll::Reduce:
        for (size_t i = 0; i < n; ++i) checkReduced(check_, c, nranks_, inputs_, i, out, i, premulScalar_);
        break;
      case Coll::ReduceScatter:
        for (size_t i = 0; i < n; ++i) checkReduced(check_, c, nranks_, inputs_, me * n + i, out, i, premulScalar_);
        break;
      case Coll::AllGather:
      case Coll::Gather:
        for (int q = 0; q < nranks_; ++q)
          for (size_t i = 0; i < n; ++i) expectBytes(q * n + i, inputs_[q], i);
        break;
      case Coll::Broadcast:
        for (size_t i = 0; i < n; ++i) expectBytes(i, inputs_[c.root], i);
        break;
      case Coll::AllToAll:
        for (int q = 0; q < nranks_; ++q)
          for (size_t i = 0; i < n; ++i) expectBytes(q * n + i, inputs_[q], me * n + i);
        break;
      case Coll::Scatter:
        for (size_t i = 0; i < n; ++i) expectBytes(i, inputs_[c.root], me * n + i);
        break;
    }
    return check_.failures();
  }

  int failures() const { return check_.failures(); }

 private:
  static constexpr char kGuard = 0x5a;
  int rank_, nranks_;
  ncclComm_t comm_;
  Case c_;
  Checker check_;
  std::vector<std::vector<char>> inputs_;
  CaseBuffer sendBuf_, recvBuf_;
  const void* send_ = nullptr;
  void* recv_ = nullptr;
  ncclRedOp_t op_ = ncclSum;
  double premulScalar_ = 1;
  bool opCreated_ = false, hasOutput_ = true, ready_ = true;
};

int runCase(int rank, int nranks, ncclComm_t comm, const Case& c, uint64_t seed) {
  PreparedCase prepared(rank, nranks, comm, c, seed);
  prepared.issue();
  return prepared.check();
}

}  // namespace

int runCollectiveMatrix(int rank, int nranks, ncclComm_t comm, const MatrixOptions& options) {
  static const DataType allTypes[] = {DataType::Int8,    DataType::Uint8,    DataType::Int32,      DataType::Uint32,
                                      DataType::Int64,   DataType::Uint64,   DataType::Float16,    DataType::Float32,
                                      DataType::Float64, DataType::Bfloat16, DataType::Float8e4m3, DataType::Float8e5m2};
  static const DataType someTypes[] = {DataType::Int8, DataType::Uint64, DataType::Float32, DataType::Bfloat16,
                                       DataType::Float8e5m2};
  static const ncclRedOp_t allOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  const std::vector<size_t> sizes = {0, 1, 2, 7, 1031};

  int failures = 0;
  uint64_t caseSeed = options.seed;
  auto run = [&](const Case& c) {
    caseSeed = caseSeed * 6364136223846793005ull + 1442695040888963407ull;
    failures += runCase(rank, nranks, comm, c, caseSeed);
  };
  const auto types = options.allTypesAndOps ? std::vector<DataType>(std::begin(allTypes), std::end(allTypes))
                                            : std::vector<DataType>(std::begin(someTypes), std::end(someTypes));
  for (int collIndex = 0; collIndex < 8; ++collIndex) {
    const Coll coll = static_cast<Coll>(collIndex);
    const int root = rooted(coll) ? nranks - 1 - (collIndex % nranks) : 0;
    for (DataType type : types)
      for (size_t count : sizes)
        for (bool inPlace : {false, true}) {
          if (reduces(coll)) {
            for (ncclRedOp_t op : allOps) {
              if (!options.allTypesAndOps && op != ncclSum && op != ncclMax && type != DataType::Float32) continue;
              run({coll, type, op, false, count, inPlace, root});
            }
            run({coll, type, ncclSum, true, count, inPlace, root});
          } else {
            run({coll, type, ncclSum, false, count, inPlace, root});
          }
        }
    if (options.largeSizes) {
      // ~3 MiB of float per rank buffer; the per-rank count shrinks when a buffer holds n blocks.
      const bool blocks = coll != Coll::AllReduce && coll != Coll::Broadcast && coll != Coll::Reduce;
      const size_t large = blocks ? 786433 / nranks : 786433;  // 786433 is prime
      run({coll, DataType::Float32, ncclSum, false, large, false, root});
      run({coll, DataType::Bfloat16, ncclSum, false, large / 3 + 1, true, root});
    }
  }
  return failures;
}

// A point-to-point shift for the random sequence: every rank sends `count` bytes to rank + distance and receives
// as many from rank - distance (one send and one receive, issued inside the caller's group).
class PreparedShift {
 public:
  PreparedShift(int rank, int nranks, ncclComm_t comm, size_t bytes, int distance, uint64_t seed)
      : rank_(rank), nranks_(nranks), comm_(comm), bytes_(bytes), distance_(distance), seed_(seed) {
    send_ = randomBytes(bytes, seed, rank);
    recv_.assign(bytes + 1, 0);
    recv_.back() = 0x5a;
  }
  void issue() {
    const int to = (rank_ + distance_) % nranks_, from = (rank_ + nranks_ - distance_) % nranks_;
    const auto ok = [](ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; };
    if (!ok(ncclSend(send_.data(), bytes_, ncclUint8, to, comm_, nullptr)) ||
        !ok(ncclRecv(recv_.data(), bytes_, ncclUint8, from, comm_, nullptr))) {
      std::fprintf(stderr, "rank %d FAIL shift of %zu bytes by %d: %s\n", rank_, bytes_, distance_, ncclGetLastError(nullptr));
      failed_ = true;
    }
  }
  int check() {
    if (failed_) return 1;
    const int from = (rank_ + nranks_ - distance_) % nranks_;
    const std::vector<char> want = randomBytes(bytes_, seed_, from);
    int bad = std::memcmp(recv_.data(), want.data(), bytes_) != 0;
    bad += recv_.back() != 0x5a;
    if (bad)
      std::fprintf(stderr, "rank %d FAIL shift of %zu bytes by %d seed=%llu: wrong bytes from rank %d or past the buffer\n", rank_,
                   bytes_, distance_, static_cast<unsigned long long>(seed_), from);
    return bad;
  }

 private:
  int rank_, nranks_;
  ncclComm_t comm_;
  size_t bytes_;
  int distance_;
  uint64_t seed_;
  std::vector<char> send_, recv_;
  bool failed_ = false;
};

int runRandomSequence(int rank, int nranks, ncclComm_t comm, uint64_t seed, int calls, bool nonBlocking, bool ncclMemory) {
  static const DataType allTypes[] = {DataType::Int8,    DataType::Uint8,    DataType::Int32,      DataType::Uint32,
                                      DataType::Int64,   DataType::Uint64,   DataType::Float16,    DataType::Float32,
                                      DataType::Float64, DataType::Bfloat16, DataType::Float8e4m3, DataType::Float8e5m2};
  static const ncclRedOp_t allOps[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  // Bytes where the plan or the transport changes (tree, direct and recursive-doubling limits, slices, the shm
  // ring's fragments, 2-rank recursive doubling's end), met exactly and one element either side.
  static const size_t edges[] = {32 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20};
  std::mt19937_64 gen(seed);  // every rank draws the same sequence
  auto draw = [&] {
    Case c{};
    c.coll = static_cast<Coll>(gen() % 8);
    c.type = allTypes[gen() % std::size(allTypes)];
    c.op = allOps[gen() % std::size(allOps)];
    c.premul = reduces(c.coll) && gen() % 6 == 0;
    if (c.premul) c.op = ncclSum;  // PreMulSum sums: the reference reads the op as Sum
    c.inPlace = (gen() & 1) != 0;
    c.root = static_cast<int>(gen() % static_cast<uint64_t>(nranks));
    const size_t elem = dataTypeSize(c.type);
    const size_t block = elem * (c.coll != Coll::AllReduce && c.coll != Coll::Broadcast && c.coll != Coll::Reduce ? static_cast<size_t>(nranks) : 1);
    size_t bytes = 0;  // of the largest buffer
    switch (gen() % 4) {
      case 0: bytes = (gen() % 4) * block; break;  // 0-3 elements
      case 1: bytes = 1 + gen() % 8192; break;
      case 2: bytes = static_cast<size_t>(std::exp2(10.0 + static_cast<double>(gen() % 11000) / 1000.0)); break;  // 1 KiB-2 MiB
      default: bytes = edges[gen() % std::size(edges)] + block * (gen() % 3) - block;
    }
    c.count = bytes / block;
    return c;
  };
  int failures = 0;
  // A step: one call, or a group. Blocking: each is checked when it returns. Non-blocking: 1-4 steps are issued
  // back to back (each returns ncclInProgress and queues on the communicator's engine), then the rank waits for
  // ncclCommGetAsyncError to read ncclSuccess and checks them all.
  struct Step {
    std::vector<Case> cases;
    std::vector<std::unique_ptr<PreparedCase>> prepared;
    std::unique_ptr<PreparedShift> shift;
    int firstCall = 0;
  };
  int inProgress = 0;  // non-blocking: calls and groups that returned ncclInProgress
  for (int k = 0; k < calls;) {
    std::vector<Step> batch;
    const int steps = nonBlocking ? 1 + static_cast<int>(gen() % 4) : 1;
    for (int st = 0; st < steps && k < calls; ++st) {
      Step& step = batch.emplace_back();
      step.firstCall = k;
      // One call in four or so is a group of 2-3 collectives, which the communicator may fuse into one plan.
      const int grouped = gen() % 4 == 0 ? 2 + static_cast<int>(gen() % 2) : 1;
      for (int g = 0; g < grouped; ++g) {
        step.cases.push_back(draw());
        step.prepared.push_back(std::make_unique<PreparedCase>(rank, nranks, comm, step.cases.back(), gen(), ncclMemory));
      }
      k += grouped;
      // Now and then a send/recv shift joins the group (or makes one with the collective).
      if (nranks > 1 && gen() % 5 == 0) {
        const size_t bytes = gen() % 3 == 0 ? gen() % 64 : static_cast<size_t>(std::exp2(static_cast<double>(gen() % 21000) / 1000.0));
        step.shift = std::make_unique<PreparedShift>(rank, nranks, comm, bytes, 1 + static_cast<int>(gen() % static_cast<uint64_t>(nranks - 1)), gen());
      }
      const bool group = grouped > 1 || step.shift;
      if (group && ncclGroupStart() != ncclSuccess) return failures + 1;
      for (auto& p : step.prepared) inProgress += p->issue() == ncclInProgress;
      if (step.shift) step.shift->issue();
      if (group) {
        const ncclResult_t end = ncclGroupEnd();
        inProgress += end == ncclInProgress;
        if (end != ncclSuccess && !(nonBlocking && end == ncclInProgress)) {
          std::fprintf(stderr, "rank %d: ncclGroupEnd of %d collectives%s failed: %s\n", rank, grouped,
                       step.shift ? " and a shift" : "", ncclGetLastError(nullptr));
          ++failures;
        }
      }
    }
    if (nonBlocking) {
      ncclResult_t state = ncclInProgress;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
      while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      if (state != ncclSuccess) {
        std::fprintf(stderr, "rank %d: the non-blocking communicator reads %s after %zu steps: %s\n", rank,
                     ncclGetErrorString(state), batch.size(), ncclGetLastError(comm));
        return failures + 1;
      }
    }
    for (Step& step : batch) {
      if (step.shift) failures += step.shift->check();
      for (size_t g = 0; g < step.prepared.size(); ++g) {
        const int bad = step.prepared[g]->check();
        failures += bad;
        if (bad && rank == 0)
          std::fprintf(stderr, "random sequence: call %d of %d%s failed: %s\n", step.firstCall + static_cast<int>(g) + 1, calls,
                       step.prepared.size() > 1 ? (" (in a group of " + std::to_string(step.prepared.size()) + ")").c_str() : "",
                       describe(step.cases[g], nranks).c_str());
      }
    }
  }
  if (nonBlocking && calls > 0 && inProgress == 0) {
    std::fprintf(stderr, "rank %d: no call or group of the non-blocking communicator returned ncclInProgress\n", rank);
    ++failures;
  }
  return failures;
}

}  // namespace topoccl::test

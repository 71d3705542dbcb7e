#include "api/collective_matrix.hpp"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
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

int runCase(int rank, int nranks, ncclComm_t comm, const Case& c, uint64_t seed) {
  const size_t elem = dataTypeSize(c.type);
  const size_t inElems = inputElems(c.coll, c.count, nranks);
  const size_t outElems = outputElems(c.coll, c.count, nranks);
  Checker check(rank, c, nranks, seed);

  std::vector<std::vector<char>> inputs(nranks);
  for (int r = 0; r < nranks; ++r)
    inputs[r] = reduces(c.coll) ? makeInput(c.type, c.op, c.premul, inElems, seed, r)
                                : randomBytes(inElems * elem, seed, r);

  // PreMulSum with a host-immediate scalar: a small integer keeps integer types exact.
  ncclRedOp_t op = c.op;
  double premulScalar = 1;
  if (c.premul) {
    unsigned char scalar[8] = {};
    premulScalar = isFloatingPoint(c.type) ? 0.5 : 3;
    storeFromDouble(c.type, scalar, 0, premulScalar);
    premulScalar = loadAsDouble(c.type, scalar, 0);
    if (ncclRedOpCreatePreMulSum(&op, scalar, static_cast<ncclDataType_t>(c.type), ncclScalarHostImmediate, comm) !=
        ncclSuccess) {
      check.fail(0, "ncclRedOpCreatePreMulSum failed", ncclGetLastError(nullptr));
      return check.failures();
    }
  }

  const bool hasOutput = !((c.coll == Coll::Reduce || c.coll == Coll::Gather) && rank != c.root);
  const bool hasInput = !((c.coll == Coll::Broadcast || c.coll == Coll::Scatter) && rank != c.root);
  std::vector<char> sendBuf(inElems * elem + 1), recvBuf(outElems * elem + 1);
  const char guard = 0x5a;
  recvBuf.back() = guard;
  const void* send = sendBuf.data();
  void* recv = recvBuf.data();
  if (inElems > 0) std::memcpy(sendBuf.data(), inputs[rank].data(), inElems * elem);

  if (c.inPlace) {
    // NCCL's in-place layouts: the input lives inside the output (or the reverse).
    switch (c.coll) {
      case Coll::AllGather:
        if (inElems > 0) std::memcpy(recvBuf.data() + rank * c.count * elem, inputs[rank].data(), inElems * elem);
        send = recvBuf.data() + rank * c.count * elem;
        break;
      case Coll::ReduceScatter:
        recv = sendBuf.data() + rank * c.count * elem;
        break;
      case Coll::Gather:
        if (rank == c.root) {
          if (inElems > 0) std::memcpy(recvBuf.data() + rank * c.count * elem, inputs[rank].data(), inElems * elem);
          send = recvBuf.data() + rank * c.count * elem;
        }
        break;
      case Coll::Scatter:
        if (rank == c.root) recv = sendBuf.data() + rank * c.count * elem;
        break;
      default:
        if (hasOutput && inElems == outElems) {
          if (inElems > 0) std::memcpy(recvBuf.data(), inputs[rank].data(), inElems * elem);
          send = recvBuf.data();
        }
        break;
    }
  }
  if (!hasOutput && c.coll == Coll::Reduce) recv = nullptr;  // non-roots may pass NULL
  if (!hasInput) send = c.inPlace ? recv : nullptr;

  if (call(c, send, recv, op, comm) != ncclSuccess) {
    check.fail(0, std::string("call failed: ") + ncclGetLastError(nullptr), "ncclSuccess");
    return check.failures();
  }
  if (c.premul) ncclRedOpDestroy(op, comm);
  if (!hasOutput) return check.failures();
  const char* out = static_cast<const char*>(recv);
  if (c.inPlace && c.coll == Coll::ReduceScatter) out = sendBuf.data() + rank * c.count * elem;
  if (recvBuf.back() != guard) check.fail(outElems, "overwritten guard byte", "untouched");

  auto expectBytes = [&](size_t outIndex, const std::vector<char>& src, size_t srcIndex) {
    if (std::memcmp(out + outIndex * elem, src.data() + srcIndex * elem, elem) != 0)
      check.fail(outIndex, "different bytes", "rank input element " + std::to_string(srcIndex));
  };
  const size_t n = c.count;
  switch (c.coll) {
    case Coll::AllReduce:
    case Coll::Reduce:
      for (size_t i = 0; i < n; ++i) checkReduced(check, c, nranks, inputs, i, out, i, premulScalar);
      break;
    case Coll::ReduceScatter:
      for (size_t i = 0; i < n; ++i) checkReduced(check, c, nranks, inputs, rank * n + i, out, i, premulScalar);
      break;
    case Coll::AllGather:
    case Coll::Gather:
      for (int q = 0; q < nranks; ++q)
        for (size_t i = 0; i < n; ++i) expectBytes(q * n + i, inputs[q], i);
      break;
    case Coll::Broadcast:
      for (size_t i = 0; i < n; ++i) expectBytes(i, inputs[c.root], i);
      break;
    case Coll::AllToAll:
      for (int q = 0; q < nranks; ++q)
        for (size_t i = 0; i < n; ++i) expectBytes(q * n + i, inputs[q], rank * n + i);
      break;
    case Coll::Scatter:
      for (size_t i = 0; i < n; ++i) expectBytes(i, inputs[c.root], rank * n + i);
      break;
  }
  return check.failures();
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

}  // namespace topoccl::test

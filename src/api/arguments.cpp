#include "api/arguments.hpp"

#include <cstdint>

#include "common/error.hpp"

namespace topoccl::api {

using algo::Collective;

void badArgument(const char* function, const std::string& what) {
  throw Error(ncclInvalidArgument, what + " (in " + function + ")");
}

void checkRank(int value, int nranks, const char* what, const char* function) {
  if (value < 0 || value >= nranks)
    badArgument(function, std::string(what) + " " + std::to_string(value) + " is out of range [0, " +
                              std::to_string(nranks - 1) + "]");
}

void checkPointer(const void* p, size_t count, const char* what, const char* function) {
  if (count > 0 && p == nullptr) badArgument(function, std::string(what) + " is NULL with a non-zero count");
}

// Distinct buffers must not overlap; NCCL's in-place layouts are the only allowed overlap.
static void checkOverlap(const void* send, size_t sendBytes, const void* recv, size_t recvBytes, bool inPlace,
                  const char* function) {
  if (inPlace || !send || !recv || sendBytes == 0 || recvBytes == 0) return;
  const char* s = static_cast<const char*>(send);
  const char* r = static_cast<const char*>(recv);
  if (s < r + recvBytes && r < s + sendBytes)
    badArgument(function, "sendbuff and recvbuff overlap but are not the in-place layout");
}

void checkCollectiveArguments(const char* function, int rank, int nranks, int root, core::CollectiveArgs& args) {
  const Collective collective = args.collective;
  const void* send = args.send;
  const void* recv = args.recv;
  const size_t count = args.count;
  const size_t elem = dataTypeSize(args.type);
  const bool rooted = collective == Collective::Broadcast || collective == Collective::Reduce ||
                      collective == Collective::Gather || collective == Collective::Scatter;
  if (rooted) checkRank(root, nranks, "root", function);
  args.root = rooted ? root : 0;
  size_t block = 0;
  size_t all = 0;  // no divisions on the per-call path
  if (__builtin_mul_overflow(count, elem, &block) || __builtin_mul_overflow(block, static_cast<size_t>(nranks), &all))
    badArgument(function, "count " + std::to_string(count) + " overflows the buffer size");
  const char* s = static_cast<const char*>(send);
  const char* r = static_cast<const char*>(recv);
  switch (collective) {
    case Collective::AllReduce:
      checkPointer(send, count, "sendbuff", function);
      checkPointer(recv, count, "recvbuff", function);
      checkOverlap(send, block, recv, block, s == r, function);
      break;
    case Collective::AllGather:
      checkPointer(send, count, "sendbuff", function);
      checkPointer(recv, count, "recvbuff", function);
      checkOverlap(send, block, recv, all, s == r + rank * block, function);
      break;
    case Collective::ReduceScatter:
      checkPointer(send, count, "sendbuff", function);
      checkPointer(recv, count, "recvbuff", function);
      checkOverlap(send, all, recv, block, r == s + rank * block, function);
      break;
    case Collective::AllToAll:
      checkPointer(send, count, "sendbuff", function);
      checkPointer(recv, count, "recvbuff", function);
      checkOverlap(send, all, recv, all, s == r, function);
      break;
    case Collective::Broadcast:
      if (rank == root) checkPointer(send, count, "sendbuff (at the root)", function);
      checkPointer(recv, count, "recvbuff", function);
      if (rank == root) checkOverlap(send, block, recv, block, s == r, function);
      break;
    case Collective::Reduce:
      checkPointer(send, count, "sendbuff", function);
      if (rank == root) {
        checkPointer(recv, count, "recvbuff (at the root)", function);
        checkOverlap(send, block, recv, block, s == r, function);
      }
      break;
    case Collective::Gather:
      checkPointer(send, count, "sendbuff", function);
      if (rank == root) {
        checkPointer(recv, count, "recvbuff (at the root)", function);
        checkOverlap(send, block, recv, all, s == r + root * block, function);
      }
      break;
    case Collective::Scatter:
      checkPointer(recv, count, "recvbuff", function);
      if (rank == root) {
        checkPointer(send, count, "sendbuff (at the root)", function);
        checkOverlap(send, all, recv, block, r == s + root * block, function);
      }
      break;
  }
}

}  // namespace topoccl::api

// topoccl's C++ API: the same core as nccl.h, with asynchronous operations that return a Work
// handle (c10d's model). ZeRO and pipeline layers, and C++ applications, use this. Errors are
// thrown as topoccl::Error (its code() is the ncclResult_t the C API would return).
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "nccl.h"
#include "topoccl/error.hpp"

namespace topoccl {

namespace core {
class Communicator;
class Work;
}  // namespace core

#ifndef TOPOCCL_PUBLIC
#define TOPOCCL_PUBLIC __attribute__((visibility("default")))
#endif

// Handle on one submitted operation or group.
class TOPOCCL_PUBLIC Work {
 public:
  Work() = default;
  bool test() const;             // finished (successfully or not)?
  void wait() const;             // blocks; throws topoccl::Error if the operation failed
  ncclResult_t result() const;   // ncclInProgress until finished
  std::string errorMessage() const;

 private:
  friend class Communicator;
  friend struct CommunicatorAccess;
  explicit Work(std::shared_ptr<core::Work> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<core::Work> impl_;
};

struct CommOptions {
  std::string name;
};

class TOPOCCL_PUBLIC Communicator {
 public:
  // Call on one rank and share the bytes with the others (MPI, a file, a store).
  static ncclUniqueId newUniqueId();
  // Collective over all `nranks` ranks.
  static Communicator create(const ncclUniqueId& id, int nranks, int rank, const CommOptions& options = {});

  Communicator() = default;
  int rank() const;
  int size() const;
  explicit operator bool() const { return impl_ != nullptr; }

  Work allReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op);
  Work allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t type);
  Work reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t type, ncclRedOp_t op);
  Work broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root);
  Work reduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root);
  Work allToAll(const void* send, void* recv, size_t count, ncclDataType_t type);
  Work gather(const void* send, void* recv, size_t count, ncclDataType_t type, int root);
  Work scatter(const void* send, void* recv, size_t count, ncclDataType_t type, int root);
  Work send(const void* buffer, size_t count, ncclDataType_t type, int peer);
  Work recv(void* buffer, size_t count, ncclDataType_t type, int peer);

  // Operations added between beginGroup() and endGroup() progress together (like
  // ncclGroupStart/End); endGroup returns one Work for all of them.
  void beginGroup();
  Work endGroup();

  // Waits for everything submitted so far.
  void finalize();
  // Collective over this communicator; an empty Communicator for NCCL_SPLIT_NOCOLOR.
  Communicator split(int color, int key, const CommOptions& options = {}) const;
  // The algorithm the selection table picks for a collective ("allreduce", ...) of `bytes`.
  std::string algorithmFor(const std::string& collective, size_t bytes) const;

 private:
  friend struct CommunicatorAccess;
  struct GroupBuffer;
  std::shared_ptr<core::Communicator> impl_;
  std::shared_ptr<GroupBuffer> group_;
};

}  // namespace topoccl

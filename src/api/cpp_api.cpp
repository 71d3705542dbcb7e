// The C++ API (include/topoccl/communicator.hpp) over core, with the C API's argument checks.
#include <cstring>
#include <mutex>

#include "api/arguments.hpp"
#include "bootstrap/bootstrap.hpp"
#include "common/error.hpp"
#include "common/params.hpp"
#include "core/communicator.hpp"
#include "topoccl/communicator.hpp"

namespace topoccl {

using algo::Collective;

struct Communicator::GroupBuffer {
  int depth = 0;
  std::vector<core::Operation> operations;
};

struct CommunicatorAccess {
  static Work submit(Communicator& comm, core::Operation op) {
    if (!comm.impl_) throw Error(ncclInvalidArgument, "operation on an empty Communicator");
    if (comm.group_ && comm.group_->depth > 0) {
      comm.group_->operations.push_back(std::move(op));
      return Work();
    }
    std::vector<core::Operation> ops;
    ops.push_back(std::move(op));
    return Work(comm.impl_->submit(std::move(ops)));
  }

  static Work collective(Communicator& comm, const char* function, Collective collective, const void* send, void* recv,
                         size_t count, ncclDataType_t type, const ncclRedOp_t* op, int root) {
    if (!comm.impl_) throw Error(ncclInvalidArgument, std::string("operation on an empty Communicator (in ") + function + ")");
    core::CollectiveArgs args;
    args.collective = collective;
    args.send = send;
    args.recv = recv;
    args.count = count;
    if (!isValidDataType(static_cast<int>(type)))
      api::badArgument(function, "datatype " + std::to_string(static_cast<int>(type)) + " is not a valid ncclDataType_t");
    args.type = static_cast<DataType>(type);
    if (op) {
      if (static_cast<int>(*op) < 0 || static_cast<int>(*op) >= ncclNumOps)
        api::badArgument(function, "op " + std::to_string(static_cast<int>(*op)) + " is not a built-in ncclRedOp_t");
      args.reduce.op = static_cast<ReduceOp>(*op);
    }
    api::checkCollectiveArguments(function, comm.impl_->rank(), comm.impl_->nranks(), root, args);
    return submit(comm, args);
  }

  static Work pointToPoint(Communicator& comm, const char* function, bool isSend, const void* buffer, size_t count,
                           ncclDataType_t type, int peer) {
    if (!comm.impl_) throw Error(ncclInvalidArgument, std::string("operation on an empty Communicator (in ") + function + ")");
    if (!isValidDataType(static_cast<int>(type)))
      api::badArgument(function, "datatype " + std::to_string(static_cast<int>(type)) + " is not a valid ncclDataType_t");
    api::checkRank(peer, comm.impl_->nranks(), "peer", function);
    api::checkPointer(buffer, count, "buffer", function);
    core::PointToPointArgs args;
    args.isSend = isSend;
    args.type = static_cast<DataType>(type);
    args.count = count;
    args.peer = peer;
    if (isSend) args.send = buffer;
    else args.recv = const_cast<void*>(buffer);
    return submit(comm, args);
  }
};

bool Work::test() const { return !impl_ || impl_->test(); }

void Work::wait() const {
  if (!impl_) return;
  impl_->wait();
  if (impl_->result() != ncclSuccess) throw Error(impl_->result(), impl_->errorMessage());
}

ncclResult_t Work::result() const { return impl_ ? impl_->result() : ncclSuccess; }

std::string Work::errorMessage() const { return impl_ ? impl_->errorMessage() : std::string(); }

ncclUniqueId Communicator::newUniqueId() {
  ncclUniqueId raw;
  std::memset(&raw, 0, sizeof(raw));
  const std::string fixed = params::kCommId.get();
  const auto id = fixed.empty() ? bootstrap::createUniqueId() : bootstrap::uniqueIdFromAddress(fixed);
  std::memcpy(raw.internal, &id, sizeof(id));
  return raw;
}

Communicator Communicator::create(const ncclUniqueId& raw, int nranks, int rank, const CommOptions& options) {
  if (nranks < 1) api::badArgument("Communicator::create", "nranks " + std::to_string(nranks) + " must be at least 1");
  api::checkRank(rank, nranks, "rank", "Communicator::create");
  bootstrap::UniqueId id;
  std::memcpy(&id, raw.internal, sizeof(id));
  if (id.magic != bootstrap::kUniqueIdMagic)
    api::badArgument("Communicator::create", "id was not produced by newUniqueId/ncclGetUniqueId");
  Communicator comm;
  core::CommOptions coreOptions;
  coreOptions.name = options.name;
  comm.impl_ = core::Communicator::create(id, nranks, rank, coreOptions);
  comm.group_ = std::make_shared<GroupBuffer>();
  return comm;
}

int Communicator::rank() const { return impl_ ? impl_->rank() : -1; }
int Communicator::size() const { return impl_ ? impl_->nranks() : 0; }

Work Communicator::allReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op) {
  return CommunicatorAccess::collective(*this, "allReduce", Collective::AllReduce, send, recv, count, type, &op, 0);
}
Work Communicator::allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t type) {
  return CommunicatorAccess::collective(*this, "allGather", Collective::AllGather, send, recv, sendCount, type, nullptr, 0);
}
Work Communicator::reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t type, ncclRedOp_t op) {
  return CommunicatorAccess::collective(*this, "reduceScatter", Collective::ReduceScatter, send, recv, recvCount, type,
                                        &op, 0);
}
Work Communicator::broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root) {
  return CommunicatorAccess::collective(*this, "broadcast", Collective::Broadcast, send, recv, count, type, nullptr, root);
}
Work Communicator::reduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root) {
  return CommunicatorAccess::collective(*this, "reduce", Collective::Reduce, send, recv, count, type, &op, root);
}
Work Communicator::allToAll(const void* send, void* recv, size_t count, ncclDataType_t type) {
  return CommunicatorAccess::collective(*this, "allToAll", Collective::AllToAll, send, recv, count, type, nullptr, 0);
}
Work Communicator::gather(const void* send, void* recv, size_t count, ncclDataType_t type, int root) {
  return CommunicatorAccess::collective(*this, "gather", Collective::Gather, send, recv, count, type, nullptr, root);
}
Work Communicator::scatter(const void* send, void* recv, size_t count, ncclDataType_t type, int root) {
  return CommunicatorAccess::collective(*this, "scatter", Collective::Scatter, send, recv, count, type, nullptr, root);
}
Work Communicator::send(const void* buffer, size_t count, ncclDataType_t type, int peer) {
  return CommunicatorAccess::pointToPoint(*this, "send", true, buffer, count, type, peer);
}
Work Communicator::recv(void* buffer, size_t count, ncclDataType_t type, int peer) {
  return CommunicatorAccess::pointToPoint(*this, "recv", false, buffer, count, type, peer);
}

void Communicator::beginGroup() {
  if (!group_) throw Error(ncclInvalidArgument, "beginGroup on an empty Communicator");
  ++group_->depth;
}

Work Communicator::endGroup() {
  if (!group_ || group_->depth == 0) throw Error(ncclInvalidUsage, "endGroup without a matching beginGroup");
  if (--group_->depth > 0) return Work();
  auto ops = std::move(group_->operations);
  group_->operations.clear();
  if (ops.empty()) return Work();
  return Work(impl_->submit(std::move(ops)));
}

void Communicator::finalize() {
  if (impl_) impl_->finalize();
}

Communicator Communicator::split(int color, int key, const CommOptions& options) const {
  if (!impl_) throw Error(ncclInvalidArgument, "split on an empty Communicator");
  core::CommOptions coreOptions;
  coreOptions.name = options.name;
  Communicator child;
  child.impl_ = impl_->split(color, key, coreOptions);
  if (child.impl_) child.group_ = std::make_shared<GroupBuffer>();
  return child;
}

std::string Communicator::algorithmFor(const std::string& collective, size_t bytes) const {
  for (int c = 0; c < algo::kNumCollectives; ++c)
    if (collective == algo::collectiveName(static_cast<Collective>(c)))
      return impl_->chosenAlgorithm(static_cast<Collective>(c), bytes);
  api::badArgument("algorithmFor", "unknown collective '" + collective + "'");
}

}  // namespace topoccl

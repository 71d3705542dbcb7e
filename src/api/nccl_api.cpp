// The nccl.h implementation: argument checks that name the bad argument, translation to core,
// last-error text. Every entry point is defined as pnccl* and exported under both names.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "api/arguments.hpp"
#include "api/comm_handle.hpp"
#include "api/group_order.hpp"
#include "bootstrap/bootstrap.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "core/communicator.hpp"
#include "core/gpu_path.hpp"
#include "transport/shm/shared_allocation.hpp"
#include "topoccl/nccl_ext.h"

using topoccl::DataType;
using topoccl::Error;
using topoccl::ReduceOp;
using topoccl::algo::Collective;
using topoccl::api::badArgument;
using topoccl::api::checkPointer;
using topoccl::api::checkRank;
namespace core = topoccl::core;

#define TOPOCCL_EXPORT __attribute__((visibility("default")))
#define TOPOCCL_ALIAS(name) __attribute__((visibility("default"), alias("p" #name)))

namespace {

thread_local std::string tlsLastError;
std::mutex gLastErrorMutex;
std::string gLastError;  // ncclGetLastError ignores its comm argument, like NCCL

void setLastError(const std::string& message) {
  tlsLastError = message;
  std::lock_guard lock(gLastErrorMutex);
  gLastError = message;
}

// Live communicator handles, so a destroyed or made-up handle is an error, not a crash.
std::mutex gCommsMutex;
std::set<ncclComm*> gComms;
// Bumped whenever a handle goes away: a thread that found a handle live at the same generation needs no
// lock to know it still is (the per-call path; a handle destroyed while another thread uses it is the
// caller's race either way).
std::atomic<uint64_t> gCommsGeneration{0};
struct CheckedComm {
  ncclComm* comm = nullptr;
  uint64_t generation = 0;
};
thread_local CheckedComm tlsCheckedComm;

void registerComm(ncclComm* comm) {
  std::lock_guard lock(gCommsMutex);
  gComms.insert(comm);
}
void unregisterComm(ncclComm* comm) {
  std::lock_guard lock(gCommsMutex);
  gComms.erase(comm);
  gCommsGeneration.fetch_add(1, std::memory_order_release);
}

// Runs `body`, turning exceptions into the status code and last-error text.
template <class Body>
ncclResult_t guarded(const char* function, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    setLastError(std::string(function) + ": " + e.what());
    TOPOCCL_WARN("%s: %s", function, e.what());
    return e.code();
  } catch (const std::bad_alloc&) {
    setLastError(std::string(function) + ": out of host memory");
    return ncclSystemError;
  } catch (const std::exception& e) {
    setLastError(std::string(function) + ": internal error: " + e.what());
    return ncclInternalError;
  }
}

ncclComm* checkComm(ncclComm_t comm, const char* function) {
  if (comm == nullptr) badArgument(function, "comm is NULL");
  const uint64_t generation = gCommsGeneration.load(std::memory_order_acquire);
  CheckedComm& checked = tlsCheckedComm;
  if (checked.comm != comm || checked.generation != generation) {
    std::lock_guard lock(gCommsMutex);
    if (!gComms.count(comm)) badArgument(function, "comm is not a live communicator (already destroyed?)");
    checked = {comm, generation};
  }
  if (!comm->impl) {
    if (comm->initResult == ncclInProgress)
      throw Error(ncclInvalidUsage, std::string("communicator initialization is still in progress (in ") + function + ")");
    throw Error(ncclInvalidUsage, std::string("communicator failed to initialize: ") + comm->initError);
  }
  return comm;
}

DataType checkType(ncclDataType_t type, const char* function) {
  if (!topoccl::isValidDataType(static_cast<int>(type)))
    badArgument(function, "datatype " + std::to_string(static_cast<int>(type)) + " is not a valid ncclDataType_t");
  return static_cast<DataType>(type);
}

core::ReduceSpec checkOp(ncclComm* comm, ncclRedOp_t op, DataType type, const char* function) {
  const int raw = static_cast<int>(op);
  if (raw >= 0 && raw < ncclNumOps) {
    core::ReduceSpec spec;
    spec.op = static_cast<ReduceOp>(raw);
    return spec;
  }
  std::lock_guard lock(comm->opsMutex);
  auto it = comm->customOps.find(raw);
  if (it == comm->customOps.end())
    badArgument(function, "op " + std::to_string(raw) + " is neither a built-in ncclRedOp_t nor a live custom op of this comm");
  if (it->second.scalarType != type)
    badArgument(function, std::string("custom op ") + std::to_string(raw) + " was created for " +
                              topoccl::dataTypeName(it->second.scalarType) + " but is used with " + topoccl::dataTypeName(type));
  return it->second;
}

// ---- groups: thread-local like NCCL ------------------------------------------------------------
struct PendingInit {
  ncclComm* handle;
  int nranks;
  topoccl::bootstrap::UniqueId id;
  int rank;
  core::CommOptions options;
};
// A collective on GPU buffers issued inside a group: enqueued on its stream at ncclGroupEnd, after the GPU
// paths of every communicator in the group are set up together (one thread may drive several ranks).
struct PendingGpuCollective {
  ncclComm* comm;
  const char* function;
  core::CollectiveArgs args;
  cudaStream_t stream;
};
// A send or receive on a GPU buffer issued inside a group: staged through host memory at ncclGroupEnd,
// together with the communicator's other point-to-point calls of the group.
struct PendingGpuPointToPoint {
  ncclComm* comm;
  core::PointToPointArgs args;
  cudaStream_t stream;
};
struct GroupState {
  int depth = 0;
  std::vector<std::pair<ncclComm*, core::Operation>> operations;
  std::vector<PendingGpuCollective> gpuCollectives;
  std::vector<PendingGpuPointToPoint> gpuPointToPoint;
  std::vector<PendingInit> inits;
  ncclResult_t firstError = ncclSuccess;
};
thread_local GroupState tlsGroup;

// Several blocking communicators, one thread: every rank's share moves a pass at a time here, in turn, while their
// engines are idle, rather than through the engines (-g 2 all-reduce of 8 B: 11 us a call, three thread hand-offs,
// against 0.63 interleaved). One thread then does all the copying, so only while the group is small: -g 2 on 2
// CPUs, 128 KiB took 7.2 us interleaved against 18 through the engines, 512 KiB 40 against 32 (perf/RESULTS.md,
// session 42). nullopt when the group is larger or an engine is busy: nothing ran, and the caller queues them.
constexpr size_t kInterleavedMaxBytes = 512 << 10;  // summed over the communicators

std::optional<ncclResult_t> runInterleaved(std::vector<std::pair<ncclComm*, std::vector<core::Operation>>>& perComm) {
  size_t bytes = 0;
  for (auto& [comm, ops] : perComm) bytes += comm->impl->operationBytes(ops);
  if (bytes > kInterleavedMaxBytes) return std::nullopt;
  size_t begun = 0;
  while (begun < perComm.size() && perComm[begun].first->impl->beginInterleaved(perComm[begun].second)) ++begun;
  std::string message;
  if (begun < perComm.size()) {
    for (size_t i = 0; i < begun; ++i) perComm[i].first->impl->endInterleaved(message);
    return std::nullopt;
  }
  std::vector<bool> finished(perComm.size(), false);
  size_t left = perComm.size();
  unsigned idle = 0;
  ncclResult_t result = ncclSuccess;
  while (left > 0) {
    bool movedAny = false;
    for (size_t i = 0; i < perComm.size(); ++i) {
      if (finished[i]) continue;
      bool moved = false;
      if (!perComm[i].first->impl->stepInterleaved(moved)) {
        movedAny |= moved;
        continue;
      }
      // Released as soon as its share is done, as its engine would be: an ncclCommAbort or destroy of it from
      // another thread need not wait for the rest of the group.
      finished[i] = true, --left, movedAny = true;
      const ncclResult_t code = perComm[i].first->impl->endInterleaved(message);
      if (code != ncclSuccess && result == ncclSuccess) {
        result = code;
        setLastError(message);
      }
    }
    if (movedAny) {
      idle = 0;
    } else if (++idle > 64) {  // waiting on ranks of other threads or processes
      sched_yield();
      if (idle > 64 + 4096) usleep(50);
    }
  }
  return result;
}

ncclResult_t runOperationsAndWait(std::vector<std::pair<ncclComm*, core::Operation>> operations) {
  std::vector<std::pair<ncclComm*, std::vector<core::Operation>>> perComm;
  for (auto& [comm, op] : operations) {
    auto it = std::find_if(perComm.begin(), perComm.end(), [&](auto& e) { return e.first == comm; });
    if (it == perComm.end()) {
      perComm.push_back({comm, {}});
      it = perComm.end() - 1;
    }
    it->second.push_back(std::move(op));
  }
  std::vector<std::pair<ncclComm*, std::shared_ptr<core::Work>>> works;
  // One blocking communicator: run on this thread. Several (one thread driving many ranks): queue
  // them all first, since each may wait on the others.
  if (perComm.size() == 1 && perComm[0].first->impl->options().blocking) {
    std::string message;
    const ncclResult_t result = perComm[0].first->impl->run(perComm[0].second, message);
    if (result != ncclSuccess) setLastError(message);
    return result;
  }
  if (perComm.size() > 1 && std::all_of(perComm.begin(), perComm.end(), [](auto& e) { return e.first->impl->options().blocking; })) {
    if (const std::optional<ncclResult_t> result = runInterleaved(perComm)) return *result;
  }
  for (auto& [comm, ops] : perComm) works.push_back({comm, comm->impl->submit(std::move(ops))});
  ncclResult_t result = ncclSuccess;
  for (auto& [comm, work] : works) {
    if (!comm->impl->options().blocking) {
      if (result == ncclSuccess) result = ncclInProgress;
      continue;
    }
    work->wait();
    if (work->result() != ncclSuccess && (result == ncclSuccess || result == ncclInProgress)) {
      result = work->result();
      setLastError(work->errorMessage());
    }
  }
  return result;
}

ncclResult_t enqueue(ncclComm* comm, core::Operation op) {
  if (tlsGroup.depth > 0) {
    tlsGroup.operations.push_back({comm, std::move(op)});
    return ncclSuccess;
  }
  if (comm->impl->options().blocking) {
    // The per-call path: the vector keeps its capacity from call to call.
    thread_local std::vector<core::Operation> single;
    single.clear();
    single.push_back(std::move(op));
    std::string message;
    const ncclResult_t result = comm->impl->run(single, message);
    if (result != ncclSuccess) setLastError(message);
    return result;
  }
  std::vector<std::pair<ncclComm*, core::Operation>> single;
  single.push_back({comm, std::move(op)});
  return runOperationsAndWait(std::move(single));
}

// The last host collective whose checks passed on this thread, with what it was built from. A training loop or a
// benchmark repeats one call, and the checks are a function of these and of the handle's generation alone.
struct CheckedCall {
  ncclComm* comm = nullptr;
  uint64_t generation = 0;
  Collective collective = Collective::AllReduce;
  const void* send = nullptr;
  const void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t datatype = ncclFloat32;
  int op = -1;  // -1: none; only built-in ops are kept (a custom op may be destroyed)
  int root = 0;
  core::CollectiveArgs args;
};
thread_local CheckedCall tlsCheckedCall;

ncclResult_t enqueueCollective(const char* function, Collective collective, const void* send, void* recv,
                               size_t count, ncclDataType_t datatype, const ncclRedOp_t* op, int root,
                               ncclComm_t commHandle, cudaStream_t stream) {
  return guarded(function, [&] {
    ncclComm* comm = checkComm(commHandle, function);
    const int rawOp = op ? static_cast<int>(*op) : -1;
    CheckedCall& last = tlsCheckedCall;
    const bool repeated = last.comm == comm && last.generation == tlsCheckedComm.generation &&
                          last.collective == collective && last.send == send && last.recv == recv && last.count == count &&
                          last.datatype == datatype && last.op == rawOp && last.root == root;
    if (!repeated) {
      const int nranks = comm->impl->nranks();
      const int rank = comm->impl->rank();
      core::CollectiveArgs args;
      args.collective = collective;
      args.send = send;
      args.recv = recv;
      args.count = count;
      args.type = checkType(datatype, function);
      if (op) args.reduce = checkOp(comm, *op, args.type, function);
      topoccl::api::checkCollectiveArguments(function, rank, nranks, root, args);
      // GPU buffers go to the stream at once (NCCL's semantics), inside a group or not; host buffers run on the
      // host path. core::gpuAvailable() is false without CUDA or a device, and then no pointer is queried.
      if (core::gpuAvailable() && (core::isGpuPointer(send) || core::isGpuPointer(recv))) {
        comm->impl->checkGpuBuffers(function, args);
        if (tlsGroup.depth > 0) {
          tlsGroup.gpuCollectives.push_back({comm, function, args, stream});
          return ncclSuccess;
        }
        comm->impl->enqueueOnGpu(function, args, stream);
        return ncclSuccess;
      }
      last.comm = nullptr;  // until the new entry is whole
      last.args = args;
      // Host memory freed and reallocated as GPU memory at the same address must be asked about again.
      if (!core::gpuAvailable() && rawOp < ncclNumOps) {
        last.generation = tlsCheckedComm.generation;
        last.collective = collective;
        last.send = send;
        last.recv = recv;
        last.count = count;
        last.datatype = datatype;
        last.op = rawOp;
        last.root = root;
        last.comm = comm;
      }
    }
    if (tlsGroup.depth == 0 && comm->impl->options().blocking) {
      std::string message;
      const ncclResult_t result = comm->impl->runCollective(last.args, message);
      if (result != ncclSuccess) setLastError(message);
      return result;
    }
    return enqueue(comm, last.args);
  });
}

core::CommOptions readConfig(const ncclConfig_t* config, const char* function) {
  core::CommOptions options;
  if (config) {
    // Accept older and newer callers: read only the fields their struct has.
    if (config->magic != 0xcafebeef)
      badArgument(function, "config was not initialized with NCCL_CONFIG_INITIALIZER (bad magic)");
    ncclConfig_t local = NCCL_CONFIG_INITIALIZER;
    std::memcpy(&local, config, std::min(config->size, sizeof(ncclConfig_t)));
    if (local.blocking != NCCL_CONFIG_UNDEF_INT) {
      if (local.blocking != 0 && local.blocking != 1)
        badArgument(function, "config->blocking must be 0 or 1, not " + std::to_string(local.blocking));
      options.blocking = local.blocking == 1;
    }
    if (local.commName) options.name = local.commName;
  }
  if (topoccl::config::lookup(topoccl::params::kCommBlocking.name()))
    options.blocking = topoccl::params::kCommBlocking.get();
  return options;
}

topoccl::bootstrap::UniqueId toId(const ncclUniqueId& raw, const char* function) {
  topoccl::bootstrap::UniqueId id;
  std::memcpy(&id, raw.internal, sizeof(id));
  if (id.magic != topoccl::bootstrap::kUniqueIdMagic)
    badArgument(function, "commId was not produced by ncclGetUniqueId (bad magic)");
  return id;
}

void finishInit(ncclComm* handle, const topoccl::bootstrap::UniqueId& id, int nranks, int rank,
                core::CommOptions options) {
  try {
    handle->impl = core::Communicator::create(id, nranks, rank, std::move(options));
    handle->initResult = ncclSuccess;
  } catch (const Error& e) {
    handle->initError = e.what();
    handle->initResult = e.code();
    throw;
  }
}

ncclResult_t initRank(ncclComm_t* out, int nranks, const ncclUniqueId& commId, int rank, ncclConfig_t* config,
                      const char* function) {
  return guarded(function, [&] {
    if (!out) badArgument(function, "comm (the output pointer) is NULL");
    *out = nullptr;
    if (nranks < 1) badArgument(function, "nranks " + std::to_string(nranks) + " must be at least 1");
    checkRank(rank, nranks, "rank", function);
    core::CommOptions options = readConfig(config, function);
    const auto id = toId(commId, function);
    auto handle = std::make_unique<ncclComm>();
    if (tlsGroup.depth > 0) {
      // Deferred: grouped inits of several ranks in one thread must run concurrently at GroupEnd.
      handle->initResult = ncclInProgress;
      tlsGroup.inits.push_back({handle.get(), nranks, id, rank, options});
    } else {
      finishInit(handle.get(), id, nranks, rank, options);
    }
    *out = handle.release();
    registerComm(*out);
    return ncclSuccess;
  });
}

}  // namespace

extern "C" {

TOPOCCL_EXPORT ncclResult_t pncclGetVersion(int* version) {
  if (!version) {
    setLastError("ncclGetVersion: version is NULL");
    return ncclInvalidArgument;
  }
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

TOPOCCL_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the topoccl developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

TOPOCCL_EXPORT const char* pncclGetLastError(ncclComm_t) {
  if (!tlsLastError.empty()) return tlsLastError.c_str();
  std::lock_guard lock(gLastErrorMutex);
  static thread_local std::string copy;
  copy = gLastError;
  return copy.c_str();
}

TOPOCCL_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  return guarded("ncclGetUniqueId", [&] {
    if (!uniqueId) badArgument("ncclGetUniqueId", "uniqueId is NULL");
    std::memset(uniqueId, 0, sizeof(*uniqueId));
    const std::string fixed = topoccl::params::kCommId.get();
    const auto id = fixed.empty() ? topoccl::bootstrap::createUniqueId() : topoccl::bootstrap::uniqueIdFromAddress(fixed);
    std::memcpy(uniqueId->internal, &id, sizeof(id));
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

TOPOCCL_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                    ncclConfig_t* config) {
  return initRank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

TOPOCCL_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || !commIds) {
    setLastError("ncclCommInitRankScalable: nId must be >= 1 and commIds non-NULL");
    return ncclInvalidArgument;
  }
  // Every rank passes the same ids in the same order; one root serves the rendezvous.
  return initRank(newcomm, nranks, commIds[0], myrank, config, "ncclCommInitRankScalable");
}

TOPOCCL_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guarded("ncclCommInitAll", [&] {
    if (!comms) badArgument("ncclCommInitAll", "comms is NULL");
    if (ndev < 1) badArgument("ncclCommInitAll", "ndev " + std::to_string(ndev) + " must be at least 1");
    const auto id = topoccl::bootstrap::createUniqueId();
    std::vector<std::unique_ptr<ncclComm>> handles(ndev);
    std::vector<std::thread> threads;
    std::vector<ncclResult_t> results(ndev, ncclSuccess);
    std::vector<std::string> errors(ndev);
    for (int r = 0; r < ndev; ++r) {
      handles[r] = std::make_unique<ncclComm>();
      handles[r]->cudaDevice = devlist ? devlist[r] : r;
      threads.emplace_back([&, r] {
        try {
          finishInit(handles[r].get(), id, ndev, r, {});
        } catch (const Error& e) {
          results[r] = e.code();
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < ndev; ++r)
      if (results[r] != ncclSuccess) throw Error(results[r], "rank " + std::to_string(r) + ": " + errors[r]);
    for (int r = 0; r < ndev; ++r) {
      comms[r] = handles[r].release();
      registerComm(comms[r]);
    }
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return guarded("ncclCommFinalize", [&] {
    ncclComm* c = checkComm(comm, "ncclCommFinalize");
    if (tlsGroup.depth > 0) throw Error(ncclInvalidUsage, "ncclCommFinalize cannot be called inside a group");
    if (!c->impl->options().blocking) return c->impl->asyncError();
    c->impl->finalize();
    const ncclResult_t r = c->impl->asyncError();
    if (r != ncclSuccess) setLastError(c->impl->asyncErrorMessage());
    return r;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  return guarded("ncclCommDestroy", [&] {
    if (comm == nullptr) return ncclSuccess;  // NCCL treats NULL as a no-op here
    {
      std::lock_guard lock(gCommsMutex);
      if (!gComms.count(comm)) badArgument("ncclCommDestroy", "comm is not a live communicator (destroyed twice?)");
    }
    if (tlsGroup.depth > 0) throw Error(ncclInvalidUsage, "ncclCommDestroy cannot be called inside a group");
    unregisterComm(comm);
    if (comm->impl) comm->impl->finalize();
    delete comm;
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  return guarded("ncclCommAbort", [&] {
    if (comm == nullptr) return ncclSuccess;
    {
      std::lock_guard lock(gCommsMutex);
      if (!gComms.count(comm)) badArgument("ncclCommAbort", "comm is not a live communicator");
    }
    unregisterComm(comm);
    if (comm->impl) comm->impl->abort();
    delete comm;
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return guarded("ncclCommRevoke", [&] {
    ncclComm* c = checkComm(comm, "ncclCommRevoke");
    if (revokeFlags != NCCL_REVOKE_DEFAULT) badArgument("ncclCommRevoke", "revokeFlags must be NCCL_REVOKE_DEFAULT (0)");
    c->impl->abort();
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                           ncclConfig_t* config) {
  return guarded("ncclCommSplit", [&] {
    ncclComm* c = checkComm(comm, "ncclCommSplit");
    if (!newcomm) badArgument("ncclCommSplit", "newcomm is NULL");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
      badArgument("ncclCommSplit", "color " + std::to_string(color) + " must be >= 0 or NCCL_SPLIT_NOCOLOR");
    *newcomm = nullptr;
    core::CommOptions options = config ? readConfig(config, "ncclCommSplit") : c->impl->options();
    auto child = c->impl->split(color, key, options);
    if (!child) return ncclSuccess;
    auto handle = std::make_unique<ncclComm>();
    handle->impl = std::move(child);
    handle->cudaDevice = c->cudaDevice;
    *newcomm = handle.release();
    registerComm(*newcomm);
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int*, int, ncclComm_t* newcomm, ncclConfig_t*, int) {
  return guarded("ncclCommShrink", [&] {
    checkComm(comm, "ncclCommShrink");
    if (newcomm) *newcomm = nullptr;
    throw Error(ncclInvalidUsage, "ncclCommShrink is not available in topoccl yet; use ncclCommSplit with "
                                  "NCCL_SPLIT_NOCOLOR on the excluded ranks while they are alive");
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return guarded("ncclCommGetAsyncError", [&] {
    if (!asyncError) badArgument("ncclCommGetAsyncError", "asyncError is NULL");
    if (comm == nullptr) badArgument("ncclCommGetAsyncError", "comm is NULL");
    {
      std::lock_guard lock(gCommsMutex);
      if (!gComms.count(comm)) badArgument("ncclCommGetAsyncError", "comm is not a live communicator");
    }
    if (!comm->impl) {
      *asyncError = comm->initResult;
      return ncclSuccess;
    }
    *asyncError = comm->impl->asyncError();
    if (*asyncError != ncclSuccess && *asyncError != ncclInProgress) setLastError(comm->impl->asyncErrorMessage());
    return ncclSuccess;
  });
}

extern "C" TOPOCCL_EXPORT ncclResult_t topocclCommPredict(ncclComm_t comm, const char* collective, size_t bytes,
                                                         int inPlace, topocclPrediction_t* prediction) {
  return guarded("topocclCommPredict", [&] {
    ncclComm* c = checkComm(comm, "topocclCommPredict");
    if (!prediction) badArgument("topocclCommPredict", "prediction is NULL");
    if (!collective) badArgument("topocclCommPredict", "collective is NULL");
    std::optional<topoccl::algo::Collective> which;
    for (int k = 0; k < topoccl::algo::kNumCollectives; ++k)
      if (std::strcmp(collective, topoccl::algo::collectiveName(static_cast<topoccl::algo::Collective>(k))) == 0)
        which = static_cast<topoccl::algo::Collective>(k);
    if (!which)
      badArgument("topocclCommPredict", std::string("collective '") + collective +
                                            "' is not allreduce, allgather, reducescatter, broadcast, reduce, alltoall, "
                                            "gather or scatter");
    const topoccl::core::Communicator::Prediction p = c->impl->predict(*which, bytes, inPlace != 0);
    std::memset(prediction, 0, sizeof(*prediction));
    std::strncpy(prediction->plan, p.plan.c_str(), sizeof(prediction->plan) - 1);
    prediction->predictedUs = p.micros;
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return guarded("ncclCommCount", [&] {
    ncclComm* c = checkComm(comm, "ncclCommCount");
    if (!count) badArgument("ncclCommCount", "count is NULL");
    *count = c->impl->nranks();
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return guarded("ncclCommCuDevice", [&] {
    ncclComm* c = checkComm(comm, "ncclCommCuDevice");
    if (!device) badArgument("ncclCommCuDevice", "device is NULL");
    *device = c->cudaDevice;  // -1: a host-memory communicator with no CUDA device
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return guarded("ncclCommUserRank", [&] {
    ncclComm* c = checkComm(comm, "ncclCommUserRank");
    if (!rank) badArgument("ncclCommUserRank", "rank is NULL");
    *rank = c->impl->rank();
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return guarded("ncclMemAlloc", [&] {
    if (!ptr) badArgument("ncclMemAlloc", "ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return ncclSuccess;
    const std::string kind = topoccl::params::kMemAlloc.get();
    if (kind != "auto" && kind != "gpu" && kind != "host")
      badArgument("ncclMemAlloc", "TOPOCCL_MEM_ALLOC=" + kind + " must be auto, gpu or host");
    if (kind == "gpu" || (kind == "auto" && core::gpuAvailable())) {
      *ptr = core::gpuAllocate(size);  // device memory, as NCCL's (throws without CUDA or a GPU)
      return ncclSuccess;
    }
    // Host memory, page aligned. Shared (a memfd) so that shm peers copy straight out of it: the
    // host analogue of NCCL's registered buffers.
    if (topoccl::params::kShmZeroCopy.get()) {
      *ptr = topoccl::transport::allocateShared(size);
      return ncclSuccess;
    }
    void* p = nullptr;
    if (posix_memalign(&p, 4096, size) != 0)
      throw Error(ncclSystemError, "ncclMemAlloc: cannot allocate " + std::to_string(size) + " bytes of host memory");
    *ptr = p;
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  if (ptr != nullptr && !core::gpuFree(ptr) && !topoccl::transport::freeShared(ptr)) std::free(ptr);
  return ncclSuccess;
}

namespace {
struct Registration {
  void* buffer;
  size_t size;
};
}  // namespace

TOPOCCL_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return guarded("ncclCommRegister", [&] {
    checkComm(comm, "ncclCommRegister");
    if (!handle) badArgument("ncclCommRegister", "handle is NULL");
    checkPointer(buff, size, "buff", "ncclCommRegister");
    // Host buffers need no pinning for shm/TCP; the handle records the range for deregistration.
    *handle = new Registration{buff, size};
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  return guarded("ncclCommDeregister", [&] {
    checkComm(comm, "ncclCommDeregister");
    if (!handle) badArgument("ncclCommDeregister", "handle is NULL");
    delete static_cast<Registration*>(handle);
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                    int winFlags) {
  return guarded("ncclCommWindowRegister", [&] {
    checkComm(comm, "ncclCommWindowRegister");
    if (!win) badArgument("ncclCommWindowRegister", "win is NULL");
    if (winFlags != NCCL_WIN_DEFAULT && winFlags != NCCL_WIN_COLL_SYMMETRIC)
      badArgument("ncclCommWindowRegister", "winFlags " + std::to_string(winFlags) + " is not a known flag");
    checkPointer(buff, size, "buff", "ncclCommWindowRegister");
    *win = reinterpret_cast<ncclWindow_t>(new Registration{buff, size});
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return guarded("ncclCommWindowDeregister", [&] {
    checkComm(comm, "ncclCommWindowDeregister");
    if (!win) badArgument("ncclCommWindowDeregister", "win is NULL");
    delete reinterpret_cast<Registration*>(win);
    return ncclSuccess;
  });
}

// NCCL 2.28's device API (nccl_device.h): device communicators that kernels of the caller's own drive. Not
// built; the entry points exist because PyTorch links them (a missing symbol stops `import torch`), and a
// call says so instead of succeeding quietly. The types stay opaque here: nccl_device.h is not ours.
TOPOCCL_EXPORT ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void* /*requirements*/, void* /*outDevComm*/) {
  return guarded("ncclDevCommCreate", [&]() -> ncclResult_t {
    checkComm(comm, "ncclDevCommCreate");
    throw Error(ncclInvalidUsage, "ncclDevCommCreate: the NCCL device API (device communicators, LSA/GIN) is not "
                                  "supported by topoccl; use the host collectives on a stream");
  });
}

TOPOCCL_EXPORT ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const void* /*devComm*/) {
  return guarded("ncclDevCommDestroy", [&]() -> ncclResult_t {
    checkComm(comm, "ncclDevCommDestroy");
    throw Error(ncclInvalidUsage, "ncclDevCommDestroy: the NCCL device API is not supported by topoccl, so no "
                                  "device communicator can exist to destroy");
  });
}

TOPOCCL_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  return guarded("ncclRedOpCreatePreMulSum", [&] {
    ncclComm* c = checkComm(comm, "ncclRedOpCreatePreMulSum");
    if (!op) badArgument("ncclRedOpCreatePreMulSum", "op is NULL");
    if (!scalar) badArgument("ncclRedOpCreatePreMulSum", "scalar is NULL");
    const DataType type = checkType(datatype, "ncclRedOpCreatePreMulSum");
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
      badArgument("ncclRedOpCreatePreMulSum", "residence must be ncclScalarDevice or ncclScalarHostImmediate");
    core::ReduceSpec spec;
    spec.op = ReduceOp::PreMulSum;
    spec.scalarType = type;
    if (residence == ncclScalarHostImmediate)
      std::memcpy(spec.scalar, scalar, topoccl::dataTypeSize(type));
    else
      spec.scalarPointer = scalar;  // read when each operation runs, as NCCL reads it in the kernel
    std::lock_guard lock(c->opsMutex);
    const int id = c->nextCustomOp++;
    c->customOps[id] = spec;
    *op = static_cast<ncclRedOp_t>(id);
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return guarded("ncclRedOpDestroy", [&] {
    ncclComm* c = checkComm(comm, "ncclRedOpDestroy");
    std::lock_guard lock(c->opsMutex);
    if (static_cast<int>(op) < ncclNumOps)
      badArgument("ncclRedOpDestroy", "op " + std::to_string(static_cast<int>(op)) + " is a built-in operator");
    if (c->customOps.erase(static_cast<int>(op)) == 0)
      badArgument("ncclRedOpDestroy", "op " + std::to_string(static_cast<int>(op)) + " is not a live custom op of this comm");
    return ncclSuccess;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclAllReduce", Collective::AllReduce, sendbuff, recvbuff, count, datatype, &op, 0, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclReduce", Collective::Reduce, sendbuff, recvbuff, count, datatype, &op, root, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                           int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclBroadcast", Collective::Broadcast, sendbuff, recvbuff, count, datatype, nullptr, root,
                           comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  return enqueueCollective("ncclBcast", Collective::Broadcast, buff, buff, count, datatype, nullptr, root, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclReduceScatter", Collective::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, &op,
                           0, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclAllGather", Collective::AllGather, sendbuff, recvbuff, sendcount, datatype, nullptr, 0,
                           comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclAlltoAll", Collective::AllToAll, sendbuff, recvbuff, count, datatype, nullptr, 0, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclGather", Collective::Gather, sendbuff, recvbuff, count, datatype, nullptr, root, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueCollective("ncclScatter", Collective::Scatter, sendbuff, recvbuff, count, datatype, nullptr, root, comm, stream);
}

static ncclResult_t pointToPoint(const char* function, bool isSend, const void* buffer, size_t count,
                                 ncclDataType_t datatype, int peer, ncclComm_t commHandle, cudaStream_t stream) {
  return guarded(function, [&] {
    ncclComm* comm = checkComm(commHandle, function);
    core::PointToPointArgs args;
    args.isSend = isSend;
    args.type = checkType(datatype, function);
    checkRank(peer, comm->impl->nranks(), "peer", function);
    checkPointer(buffer, count, isSend ? "sendbuff" : "recvbuff", function);
    args.count = count;
    args.peer = peer;
    if (isSend) args.send = buffer;
    else args.recv = const_cast<void*>(buffer);
    if (tlsGroup.depth == 0 && peer == comm->impl->rank() && count > 0)
      throw Error(ncclInvalidUsage, std::string(function) + " to self outside a group would wait forever; "
                                                            "put the matching send and recv in one ncclGroupStart/End");
    // GPU buffers: in the plan kernel where the GPU path runs sends and receives, else through pinned host memory on
    // the stream (the host transports move them).
    if (core::gpuAvailable() && count > 0 && core::isGpuPointer(buffer)) {
      if (tlsGroup.depth > 0) {
        tlsGroup.gpuPointToPoint.push_back({comm, args, stream});
        return ncclSuccess;
      }
      const std::vector<core::PointToPointArgs> single{args};
      if (comm->impl->pointToPointOnGpuKernel(single)) comm->impl->enqueuePointToPointOnGpu(single, stream);
      else comm->impl->enqueueStaged(function, {args}, stream);
      return ncclSuccess;
    }
    return enqueue(comm, args);
  });
}

TOPOCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                      ncclComm_t comm, cudaStream_t stream) {
  return pointToPoint("ncclSend", true, sendbuff, count, datatype, peer, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                      cudaStream_t stream) {
  return pointToPoint("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

TOPOCCL_EXPORT ncclResult_t pncclGroupStart() {
  ++tlsGroup.depth;
  return ncclSuccess;
}

// Sets up the GPU paths of `setUp` (communicator, device) side by side: each set-up is collective over its ranks,
// and one thread may drive several of them. `forPointToPoint`: a failure leaves their sends and receives staged.
static void setUpGpuPaths(const std::vector<std::pair<ncclComm*, int>>& setUp, bool forPointToPoint = false) {
  const auto setUpOne = [&](const std::pair<ncclComm*, int>& s) {
    if (forPointToPoint) s.first->impl->setUpGpuPathForPointToPoint(s.second);
    else s.first->impl->ensureGpuPath(s.second);
  };
  if (setUp.size() == 1) {
    setUpOne(setUp[0]);
  } else if (setUp.size() > 1) {
    std::vector<std::thread> threads;
    std::vector<std::optional<Error>> errors(setUp.size());
    for (size_t i = 0; i < setUp.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          setUpOne(setUp[i]);
        } catch (const Error& e) {
          errors[i] = e;
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) throw *e;
  }
}

// Sets up the GPU path of every grouped communicator that has none, concurrently (the set-up is collective
// over each communicator's ranks, and one thread may drive several of them), then enqueues the collectives
// in call order. Each set-up runs on the device that holds the call's buffers.
static void enqueueGroupedGpuCollectives(const std::vector<PendingGpuCollective>& pending) {
  std::vector<std::pair<ncclComm*, int>> setUp;
  for (const PendingGpuCollective& p : pending)
    if (!p.comm->impl->hasGpuPath() && std::none_of(setUp.begin(), setUp.end(), [&](const auto& q) { return q.first == p.comm; }))
      setUp.push_back({p.comm, core::gpuDeviceOf(p.args.recv ? p.args.recv : p.args.send)});
  setUpGpuPaths(setUp);
  // One communicator (a rank per thread or process, PyTorch's case): its calls in order, a run per stream, which
  // the GPU path fuses into as few launches as it can. Several (one thread driving several ranks, nccl-tests'
  // -g): call by call, every communicator's first call before any second, so that no rank's second launch is
  // queued ahead of a peer's first, which it may wait for (CUDA feeds the streams of a process through a few
  // hardware queues). This thread claims those ranks, so their GPU paths do not wait for it to issue the calls
  // of the others (core/launch_order.hpp).
  const bool oneCommunicator = std::all_of(pending.begin(), pending.end(), [&](const PendingGpuCollective& p) {
    return p.comm == pending.front().comm;
  });
  if (!oneCommunicator) {
    for (const PendingGpuCollective& p : pending) p.comm->impl->claimGpuCalls();
    for (size_t i : topoccl::api::interleaveByCommunicator(pending, [](const PendingGpuCollective& p) { return p.comm; }))
      pending[i].comm->impl->enqueueOnGpu(pending[i].function, pending[i].args, pending[i].stream);
    return;
  }
  std::vector<core::CollectiveArgs> run;
  for (size_t i = 0; i < pending.size(); ++i) {
    run.push_back(pending[i].args);
    if (i + 1 == pending.size() || pending[i + 1].stream != pending[i].stream) {
      pending[i].comm->impl->enqueueGroupOnGpu(pending[i].function, run, pending[i].stream);
      run.clear();
    }
  }
}

// Each communicator's GPU sends and receives of the group, on the stream of its first call (the others join it):
// one launch of the plan kernel where its GPU path runs them (2-rank communicators that one thread drives set
// theirs up side by side first); else staged as one job, with that communicator's host point-to-point calls of
// the group folded in (a send on the GPU and a receive in host memory may need each other). Returns the jobs
// that hold host buffers: host calls finish before ncclGroupEnd returns, as they do without a GPU call beside them.
static std::vector<std::shared_ptr<core::Work>> enqueueGroupedGpuPointToPoint(
    const std::vector<PendingGpuPointToPoint>& pending, std::vector<std::pair<ncclComm*, core::Operation>>& operations) {
  std::vector<ncclComm*> comms;
  for (const PendingGpuPointToPoint& p : pending)
    if (std::find(comms.begin(), comms.end(), p.comm) == comms.end()) comms.push_back(p.comm);
  const auto callsOf = [&](ncclComm* comm) {
    std::vector<core::PointToPointArgs> calls;
    for (const PendingGpuPointToPoint& p : pending)
      if (p.comm == comm) calls.push_back(p.args);
    return calls;
  };
  // Every rank of a communicator in this group (one thread drives them all): they set up alike on any rank count.
  const auto everyRankInGroup = [&](ncclComm* comm) {
    const auto same = std::count_if(comms.begin(), comms.end(), [&](ncclComm* c) {
      return c->impl->communicatorHash() == comm->impl->communicatorHash();
    });
    return same == comm->impl->nranks();
  };
  std::vector<std::pair<ncclComm*, int>> setUp;
  for (ncclComm* comm : comms)
    if (const auto calls = callsOf(comm); comm->impl->pointToPointSetsUpGpuPath(calls, everyRankInGroup(comm)))
      setUp.push_back({comm, core::gpuDeviceOf(calls.front().isSend ? calls.front().send : calls.front().recv)});
  setUpGpuPaths(setUp, true);
  std::vector<std::shared_ptr<core::Work>> hostJobs;
  for (ncclComm* comm : comms) {
    std::vector<core::Operation> ops;
    std::vector<void*> streams;
    for (const PendingGpuPointToPoint& p : pending) {
      if (p.comm != comm) continue;
      ops.push_back(p.args);
      if (std::find(streams.begin(), streams.end(), static_cast<void*>(p.stream)) == streams.end()) streams.push_back(p.stream);
    }
    if (const auto calls = callsOf(comm); comm->impl->pointToPointOnGpuKernel(calls, everyRankInGroup(comm))) {
      comm->impl->enqueuePointToPointOnGpu(calls, streams.front(), streams);
      continue;
    }
    bool folded = false;
    for (auto it = operations.begin(); it != operations.end();) {
      if (it->first == comm && std::holds_alternative<core::PointToPointArgs>(it->second)) {
        ops.push_back(std::move(it->second));
        it = operations.erase(it);
        folded = true;
      } else {
        ++it;
      }
    }
    auto work = comm->impl->enqueueStaged("ncclGroupEnd", std::move(ops), streams.front(), streams);
    if (folded) hostJobs.push_back(std::move(work));
  }
  return hostJobs;
}

static ncclResult_t endGroup(bool simulate, ncclSimInfo_t* simInfo) {
  if (tlsGroup.depth == 0) {
    setLastError("ncclGroupEnd: called without a matching ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--tlsGroup.depth > 0) return ncclSuccess;
  auto inits = std::move(tlsGroup.inits);
  auto operations = std::move(tlsGroup.operations);
  auto gpuCollectives = std::move(tlsGroup.gpuCollectives);
  auto gpuPointToPoint = std::move(tlsGroup.gpuPointToPoint);
  tlsGroup = GroupState{};
  if (simulate) {
    // Nothing runs; the cost model is not wired to the executor yet, so the estimate is undefined.
    if (simInfo) simInfo->estimatedTime = NCCL_UNDEF_FLOAT;
    return ncclSuccess;
  }
  return guarded("ncclGroupEnd", [&] {
    if (!inits.empty()) {
      std::vector<std::thread> threads;
      std::vector<ncclResult_t> results(inits.size(), ncclSuccess);
      std::vector<std::string> errors(inits.size());
      const int caller = static_cast<int>(gettid());  // it, not the helper threads, will call the communicators
      for (size_t i = 0; i < inits.size(); ++i)
        threads.emplace_back([&, i] {
          try {
            core::CommOptions options = inits[i].options;
            options.callerThread = caller;
            finishInit(inits[i].handle, inits[i].id, inits[i].nranks, inits[i].rank, std::move(options));
          } catch (const Error& e) {
            results[i] = e.code();
            errors[i] = e.what();
          }
        });
      for (auto& t : threads) t.join();
      for (size_t i = 0; i < inits.size(); ++i)
        if (results[i] != ncclSuccess) throw Error(results[i], "grouped init of rank " + std::to_string(inits[i].rank) + ": " + errors[i]);
    }
    if (!gpuCollectives.empty()) enqueueGroupedGpuCollectives(gpuCollectives);
    std::vector<std::shared_ptr<core::Work>> hostJobs;
    if (!gpuPointToPoint.empty()) hostJobs = enqueueGroupedGpuPointToPoint(gpuPointToPoint, operations);
    ncclResult_t result = operations.empty() ? ncclSuccess : runOperationsAndWait(std::move(operations));
    for (const auto& work : hostJobs) {
      work->wait();
      if (work->result() != ncclSuccess && result == ncclSuccess) {
        result = work->result();
        setLastError(work->errorMessage());
      }
    }
    return result;
  });
}

TOPOCCL_EXPORT ncclResult_t pncclGroupEnd() { return endGroup(false, nullptr); }

TOPOCCL_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) { return endGroup(true, simInfo); }

// nccl* names are aliases of the pnccl* definitions (PMPI-style interposition).
ncclResult_t ncclGetVersion(int*) TOPOCCL_ALIAS(ncclGetVersion);
const char* ncclGetErrorString(ncclResult_t) TOPOCCL_ALIAS(ncclGetErrorString);
const char* ncclGetLastError(ncclComm_t) TOPOCCL_ALIAS(ncclGetLastError);
ncclResult_t ncclGetUniqueId(ncclUniqueId*) TOPOCCL_ALIAS(ncclGetUniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) TOPOCCL_ALIAS(ncclCommInitRank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) TOPOCCL_ALIAS(ncclCommInitRankConfig);
ncclResult_t ncclCommInitRankScalable(ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*) TOPOCCL_ALIAS(ncclCommInitRankScalable);
ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*) TOPOCCL_ALIAS(ncclCommInitAll);
ncclResult_t ncclCommFinalize(ncclComm_t) TOPOCCL_ALIAS(ncclCommFinalize);
ncclResult_t ncclCommDestroy(ncclComm_t) TOPOCCL_ALIAS(ncclCommDestroy);
ncclResult_t ncclCommAbort(ncclComm_t) TOPOCCL_ALIAS(ncclCommAbort);
ncclResult_t ncclCommRevoke(ncclComm_t, int) TOPOCCL_ALIAS(ncclCommRevoke);
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) TOPOCCL_ALIAS(ncclCommSplit);
ncclResult_t ncclCommShrink(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) TOPOCCL_ALIAS(ncclCommShrink);
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*) TOPOCCL_ALIAS(ncclCommGetAsyncError);
ncclResult_t ncclCommCount(const ncclComm_t, int*) TOPOCCL_ALIAS(ncclCommCount);
ncclResult_t ncclCommCuDevice(const ncclComm_t, int*) TOPOCCL_ALIAS(ncclCommCuDevice);
ncclResult_t ncclCommUserRank(const ncclComm_t, int*) TOPOCCL_ALIAS(ncclCommUserRank);
ncclResult_t ncclMemAlloc(void**, size_t) TOPOCCL_ALIAS(ncclMemAlloc);
ncclResult_t ncclMemFree(void*) TOPOCCL_ALIAS(ncclMemFree);
ncclResult_t ncclCommRegister(const ncclComm_t, void*, size_t, void**) TOPOCCL_ALIAS(ncclCommRegister);
ncclResult_t ncclCommDeregister(const ncclComm_t, void*) TOPOCCL_ALIAS(ncclCommDeregister);
ncclResult_t ncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int) TOPOCCL_ALIAS(ncclCommWindowRegister);
ncclResult_t ncclCommWindowDeregister(ncclComm_t, ncclWindow_t) TOPOCCL_ALIAS(ncclCommWindowDeregister);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t) TOPOCCL_ALIAS(ncclRedOpCreatePreMulSum);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t, ncclComm_t) TOPOCCL_ALIAS(ncclRedOpDestroy);
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclAllReduce);
ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclReduce);
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclBroadcast);
ncclResult_t ncclBcast(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclBcast);
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclReduceScatter);
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclAllGather);
ncclResult_t ncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclAlltoAll);
ncclResult_t ncclGather(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclGather);
ncclResult_t ncclScatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclScatter);
ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclSend);
ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) TOPOCCL_ALIAS(ncclRecv);
ncclResult_t ncclGroupStart(void) TOPOCCL_ALIAS(ncclGroupStart);
ncclResult_t ncclGroupEnd(void) TOPOCCL_ALIAS(ncclGroupEnd);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t*) TOPOCCL_ALIAS(ncclGroupSimulateEnd);
ncclResult_t ncclDevCommCreate(ncclComm_t, const void*, void*) TOPOCCL_ALIAS(ncclDevCommCreate);
ncclResult_t ncclDevCommDestroy(ncclComm_t, const void*) TOPOCCL_ALIAS(ncclDevCommDestroy);

}  // extern "C"

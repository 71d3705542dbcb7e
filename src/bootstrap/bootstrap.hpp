// Bootstrap: the out-of-band TCP plumbing every communicator starts from. A unique id names a
// root rendezvous (address + random secret); ranks meet there once, learn each other's bootstrap
// addresses, then talk directly (allgather, barrier, tagged send/recv) for the communicator's life.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace topoccl::bootstrap {

// Fits in ncclUniqueId (128 bytes), trivially copyable.
struct UniqueId {
  uint64_t magic = 0;        // kUniqueIdMagic when valid
  uint64_t secret = 0;       // random; ranks that do not present it are refused
  uint16_t family = 0;       // AF_INET or AF_INET6
  uint16_t port = 0;         // network byte order is handled inside; this is host order
  uint8_t address[16] = {};  // IPv4 in the first 4 bytes, or IPv6
};
inline constexpr uint64_t kUniqueIdMagic = 0x746f706f63636c31ull;  // "topoccl1"
static_assert(sizeof(UniqueId) <= 128);

// Starts a root rendezvous in this process (a thread that serves one communicator's init and
// then exits) and returns its id. Honours NCCL_COMM_ID (fixed ip:port) and NCCL_SOCKET_IFNAME.
UniqueId createUniqueId();
// Parses "ip:port" (NCCL_COMM_ID); the secret is derived from the string so every rank agrees.
UniqueId uniqueIdFromAddress(const std::string& hostPort);
std::string describe(const UniqueId& id);  // "10.0.0.1:41234"
uint64_t commHash(const UniqueId& id);      // stable per id, used to name shm segments

class Bootstrap {
 public:
  // Joins the rendezvous as `rank` of `nranks`. Blocks until all ranks joined, or throws
  // topoccl::Error naming what went wrong (wrong secret, duplicate rank, nranks mismatch, root
  // unreachable, ranks that never arrived within `timeout`).
  static std::unique_ptr<Bootstrap> join(const UniqueId& id, int rank, int nranks,
                                         std::chrono::milliseconds timeout);
  virtual ~Bootstrap() = default;

  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // data holds nranks slots of bytesPerRank; slot rank() is this rank's contribution, and on
  // return every slot is filled.
  virtual void allGather(void* data, size_t bytesPerRank) = 0;
  virtual void barrier() = 0;
  // Point-to-point messages, matched by (peer, tag) in order; recv must be given the exact size.
  virtual void send(int peer, int tag, const void* data, size_t bytes) = 0;
  virtual void recv(int peer, int tag, void* data, size_t bytes) = 0;
  // Unblocks any call in progress with an error; used by ncclCommAbort.
  virtual void abort() = 0;
};

}  // namespace topoccl::bootstrap

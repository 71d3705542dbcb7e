// Wire formats of the bootstrap (internal). Ranks of one communicator run the same build, so the
// structs travel as raw bytes; magics reject strangers and garbage before anything is trusted.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/socket.hpp"

namespace topoccl::bootstrap::wire {

inline constexpr size_t kAddressChars = 64;  // "[ipv6]:port" fits with room to spare

// Rank -> root, once, right after connecting.
struct RootHello {
  uint64_t magic = 0;
  uint64_t secret = 0;
  int32_t rank = -1;
  int32_t nranks = 0;
  uint32_t timeoutMs = 0;  // what the rank has left; the root gives up on missing ranks then
  uint32_t reserved = 0;
  char listenAddress[kAddressChars] = {};  // the rank's own bootstrap listener, "ip:port"
};
inline constexpr uint64_t kRootHelloMagic = 0x746f706f2d686921ull;  // "topo-hi!"

// Root -> rank: a status, then either nranks addresses (success) or an error sentence.
struct RootReply {
  uint64_t magic = 0;
  int32_t result = 0;  // ncclResult_t
  uint32_t payloadBytes = 0;
};
inline constexpr uint64_t kRootReplyMagic = 0x746f706f2d726521ull;  // "topo-re!"

// Rank -> rank, first bytes on every direct connection.
struct PeerHello {
  uint64_t magic = 0;
  uint64_t secret = 0;
  int32_t rank = -1;
  int32_t reserved = 0;
};
inline constexpr uint64_t kPeerHelloMagic = 0x746f706f2d706521ull;  // "topo-pe!"

// Rank -> rank, before every message's payload.
enum class MessageKind : uint32_t { User = 1, AllGather = 2, Barrier = 3 };
struct MessageHeader {
  uint32_t kind = 0;
  int32_t tag = 0;
  uint64_t bytes = 0;
};
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;  // sanity bound on a header

inline void storeAddress(char (&into)[kAddressChars], const std::string& text) {
  std::memset(into, 0, kAddressChars);
  std::memcpy(into, text.data(), std::min(text.size(), kAddressChars - 1));
}
inline std::string loadAddress(const char (&from)[kAddressChars]) {
  return std::string(from, strnlen(from, kAddressChars));
}

}  // namespace topoccl::bootstrap::wire

namespace topoccl::bootstrap::detail {

// Binds the root's listener on `address` (throws if it cannot), then serves one rendezvous on a
// detached thread that owns everything it touches, so the caller may return or exit at any time.
// `fixedPort`: an NCCL_COMM_ID port, reused across runs (SO_REUSEADDR). Returns the bound address.
SocketAddress startRoot(const SocketAddress& address, uint64_t secret, bool fixedPort);

// The root's address inside an id; throws ncclInvalidArgument for an id that is not one.
SocketAddress rootAddressOf(const UniqueId& id);
// NCCL_COMM_ID rule: when the variable is set and `id` came from it, rank 0 hosts the root.
bool hostsCommIdRoot(const UniqueId& id, int rank);

}  // namespace topoccl::bootstrap::detail

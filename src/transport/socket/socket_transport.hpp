// TCP transport: between hosts, or on loopback when nothing better applies. Each Connection is a
// few TCP streams (NCCL_NSOCKS_PERTHREAD) over which every message is striped; the lower rank
// dials, the higher rank accepts inside progress(), matching the dialler by a hello.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/socket.hpp"
#include "transport/transport.hpp"

namespace topoccl::transport {

// A NIC this rank sends and listens on. `address` has port 0; the listener picks the port.
struct LocalNic {
  std::string name;  // interface
  bootstrap::SocketAddress address;
  double gbps = 0;   // 0: unknown (streams then share evenly)
  int rail = 0;      // NICs of one rail reach each other
  bool near = true;  // nearest this rank (cluster file); TOPOCCL_NET_NICS=near dials only these
};

// Opens a listener on every NIC in `nics` (none: the one interface NCCL_SOCKET_IFNAME selects) and
// reports them in *listenOut (for PeerInfo::nics). A connection to another host then runs
// NCCL_NSOCKS_PERTHREAD streams between each pair of same-rail NICs and stripes large messages over them
// in proportion to the pair's speed; to the same host it runs one pair (loopback).
std::unique_ptr<Transport> makeSocketTransport(const CommIdentity& identity, std::vector<LocalNic> nics,
                                               std::vector<NicEndpoint>* listenOut, std::string hostId);
// One NIC chosen by NCCL_SOCKET_IFNAME; its "ip:port" in *listenAddressOut.
std::unique_ptr<Transport> makeSocketTransport(const CommIdentity& identity, std::string* listenAddressOut,
                                               std::string hostId = {});

namespace socket_detail {

// How messages are cut across a connection's streams; the same code runs on both sides, so both agree.
// Even weights: part j of message `sequence` goes on stream (sequence + j) % streams, parts of equal size.
// Unequal weights (in decreasing order): part j on stream j, sized in proportion to its weight; small
// messages whole on stream 0. Part boundaries are multiples of kStripeAlign.
inline constexpr size_t kStripeAlign = 4096;            // keeps element boundaries inside one part
inline constexpr size_t kMinStripeBytes = 256 << 10;    // smaller messages go whole on one stream
class StripePlanner {
 public:
  struct Part {
    int stream = 0;
    size_t offset = 0;
    size_t length = 0;
  };
  explicit StripePlanner(std::vector<uint32_t> weights = {1});
  int streams() const { return static_cast<int>(weights_.size()); }
  int partCount(size_t bytes) const;
  int firstStream(uint64_t sequence) const;  // the stream carrying part 0
  Part part(size_t bytes, uint64_t sequence, int part) const;
  int partOnStream(size_t bytes, uint64_t sequence, int stream) const;  // -1: none

 private:
  size_t evenPartBytes(size_t bytes) const;
  std::vector<uint32_t> weights_;
  std::vector<uint64_t> cumulative_;
  bool even_ = true;
};

// Where one dialled stream goes: from a local NIC's address to the peer's listener on the NIC of the same rail.
struct StreamRoute {
  bootstrap::SocketAddress local;  // port 0: bound before connect, so the stream leaves through this NIC
  bootstrap::SocketAddress remote;
  std::string label;  // "eth0->eth0"
  uint32_t weight = 1;
};
// The dialler's streams to a peer: one pair of NICs per rail both ends have (only this rank's near NICs
// when `nearOnly`), `streamsPerPair` streams each (0: automatic, 1 to the same host, else 2 over one pair
// and 1 per pair over several), weighted by the pair's slower Mbit/s (all 1 when any speed is unknown),
// heaviest first. Same host, or no rail in common: the first NIC of each end.
std::vector<StreamRoute> planRoutes(const std::vector<NicEndpoint>& mine, const std::vector<NicEndpoint>& theirs,
                                    bool sameHost, int streamsPerPair, bool nearOnly);

}  // namespace socket_detail

}  // namespace topoccl::transport

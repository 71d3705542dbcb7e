// TCP transport: between hosts, or on loopback when nothing better applies. Each Connection is a
// few TCP streams (NCCL_NSOCKS_PERTHREAD) over which every message is striped; the lower rank
// dials, the higher rank accepts inside progress(), matching the dialler by a hello.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "transport/transport.hpp"

namespace topoccl::transport {

// Opens the data listener on the interface NCCL_SOCKET_IFNAME selects and writes its "ip:port"
// to *listenAddressOut (for PeerInfo::socketAddress). `hostId` (PeerInfo::hostId of this rank) lets
// NCCL_NSOCKS_PERTHREAD=0 (automatic) use one stream to peers on the same host and two to others.
std::unique_ptr<Transport> makeSocketTransport(const CommIdentity& identity, std::string* listenAddressOut,
                                               std::string hostId = {});

namespace socket_detail {

// How one message is cut across streams; the same function runs on both sides, so both agree.
// Part j of message number `sequence` (0-based) travels on stream (sequence + j) % nstreams.
struct Stripe {
  int parts = 1;
  size_t partBytes = 0;  // every part but the last is exactly this long; a multiple of kStripeAlign
};
inline constexpr size_t kStripeAlign = 4096;            // keeps element boundaries inside one part
inline constexpr size_t kMinStripeBytes = 256 << 10;    // smaller messages go whole on one stream
Stripe planStripe(size_t bytes, int nstreams);
size_t partOffset(const Stripe& stripe, int part);
size_t partLength(const Stripe& stripe, size_t bytes, int part);

}  // namespace socket_detail

}  // namespace topoccl::transport

// The local transport: ranks that are threads of one process. Peers meet in a process-wide
// registry and the receiver reads the sender's buffer directly (zero copy).
#pragma once

#include <memory>

#include "transport/transport.hpp"

namespace topoccl::transport {

// One per rank (identity.rank). canConnect: same processToken (and NCCL_P2P_DISABLE unset).
std::unique_ptr<Transport> makeLocalTransport(const CommIdentity& identity);

}  // namespace topoccl::transport

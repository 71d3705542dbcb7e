#include "transport/transport.hpp"

#include "common/error.hpp"

namespace topoccl::transport {

Ticket Connection::postSendMirrored(const void* data, void* mirror, size_t bytes) {
  (void)data, (void)mirror;
  throwInternalError(describe() + ": mirrored send of " + std::to_string(bytes) +
                     " bytes, which this connection cannot mirror (ask canMirror first)");
}

}  // namespace topoccl::transport

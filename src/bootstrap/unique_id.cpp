// Unique ids: where the root listens and the secret ranks must present there.
#include <random>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/protocol.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

namespace topoccl::bootstrap {
namespace {

uint64_t fnv1a(const void* data, size_t bytes, uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* cursor = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ cursor[i]) * 0x100000001b3ull;
  return hash;
}

// Final avalanche so nearby inputs give unrelated hashes (splitmix64's finalizer).
uint64_t mix(uint64_t value) {
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

uint64_t randomSecret() {
  std::random_device device;  // /dev/urandom (or getrandom) with libstdc++ on Linux
  uint64_t secret = 0;
  while (secret == 0) secret = (uint64_t{device()} << 32) ^ device();
  return secret;
}

UniqueId makeId(const SocketAddress& address, uint64_t secret) {
  UniqueId id;
  id.magic = kUniqueIdMagic;
  id.secret = secret;
  id.family = static_cast<uint16_t>(address.family());
  id.port = address.port();
  const auto bytes = address.ipBytes();
  std::copy(bytes.begin(), bytes.end(), id.address);
  return id;
}

}  // namespace

namespace detail {

SocketAddress rootAddressOf(const UniqueId& id) {
  if (id.magic != kUniqueIdMagic)
    throwInvalidArgument("invalid unique id (bad magic): pass the id made by ncclGetUniqueId on one rank to all ranks");
  return SocketAddress::fromBytes(id.family, id.address, id.port);
}

bool hostsCommIdRoot(const UniqueId& id, int rank) {
  if (rank != 0) return false;
  const std::string commId = params::kCommId.get();
  if (commId.empty()) return false;
  const UniqueId fromEnv = uniqueIdFromAddress(commId);
  return fromEnv.secret == id.secret && fromEnv.port == id.port && fromEnv.family == id.family &&
         std::equal(std::begin(id.address), std::end(id.address), std::begin(fromEnv.address));
}

}  // namespace detail

UniqueId createUniqueId() {
  const std::string commId = params::kCommId.get();
  if (!commId.empty()) {
    // Fixed root: every rank derives the same id from the variable, and rank 0 hosts the root
    // inside Bootstrap::join (see hostsCommIdRoot).
    TOPOCCL_INFO(log::kBootstrap, "%s=%s: rank 0 will host the bootstrap root", params::kCommId.name(),
                 commId.c_str());
    return uniqueIdFromAddress(commId);
  }
  const NetworkInterface itf = selectInterface();
  const uint64_t secret = randomSecret();
  const SocketAddress bound = detail::startRoot(itf.address, secret, false);
  TOPOCCL_INFO(log::kBootstrap, "bootstrap root listening on %s (interface %s)", bound.toString().c_str(),
               itf.name.c_str());
  return makeId(bound, secret);
}

UniqueId uniqueIdFromAddress(const std::string& hostPort) {
  const SocketAddress address = SocketAddress::parse(hostPort);
  // Derived from the normalised address so "localhost:5000" and "127.0.0.1:5000" agree; it keeps
  // other communicators' strays out, not attackers (anyone who knows the string knows the secret).
  const std::string normalised = "topoccl-comm-id " + address.toString();
  uint64_t secret = mix(fnv1a(normalised.data(), normalised.size()));
  if (secret == 0) secret = 1;
  return makeId(address, secret);
}

std::string describe(const UniqueId& id) {
  if (id.magic != kUniqueIdMagic) return "<invalid unique id>";
  if (id.family != AF_INET && id.family != AF_INET6) return "<unique id with unknown address family>";
  return SocketAddress::fromBytes(id.family, id.address, id.port).toString();
}

uint64_t commHash(const UniqueId& id) {
  uint64_t hash = fnv1a(&id.magic, sizeof(id.magic));
  hash = fnv1a(&id.secret, sizeof(id.secret), hash);
  hash = fnv1a(&id.family, sizeof(id.family), hash);
  hash = fnv1a(&id.port, sizeof(id.port), hash);
  hash = fnv1a(id.address, sizeof(id.address), hash);
  return mix(hash);
}

}  // namespace topoccl::bootstrap

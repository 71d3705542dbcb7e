#include "bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

namespace topoccl::bootstrap {

// ---------------------------------------------------------------------------------------------
// FileDescriptor

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int FileDescriptor::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void FileDescriptor::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

// ---------------------------------------------------------------------------------------------
// SocketAddress

SocketAddress::SocketAddress(const sockaddr* address, socklen_t length) {
  if (length > sizeof(storage_)) length = sizeof(storage_);
  std::memcpy(&storage_, address, length);
  length_ = length;
}

namespace {

std::optional<SocketAddress> parseNumeric(const std::string& host, uint16_t port) {
  sockaddr_in v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(port);
    return SocketAddress(reinterpret_cast<const sockaddr*>(&v4), sizeof(v4));
  }
  sockaddr_in6 v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(port);
    return SocketAddress(reinterpret_cast<const sockaddr*>(&v6), sizeof(v6));
  }
  return std::nullopt;
}

}  // namespace

SocketAddress SocketAddress::parse(const std::string& hostPort) {
  const auto fail = [&](const std::string& why) -> SocketAddress {
    throwInvalidArgument("cannot parse socket address '" + hostPort + "': " + why +
                         " (expected ip:port, [ipv6]:port or host:port)");
  };
  std::string host;
  std::string portText;
  if (!hostPort.empty() && hostPort.front() == '[') {
    const auto close = hostPort.find(']');
    if (close == std::string::npos || close + 1 >= hostPort.size() || hostPort[close + 1] != ':')
      return fail("unterminated [ipv6] or missing :port");
    host = hostPort.substr(1, close - 1);
    portText = hostPort.substr(close + 2);
  } else {
    const auto colon = hostPort.rfind(':');
    if (colon == std::string::npos) return fail("missing :port");
    host = hostPort.substr(0, colon);
    if (host.find(':') != std::string::npos) return fail("IPv6 addresses need brackets");
    portText = hostPort.substr(colon + 1);
  }
  if (host.empty()) return fail("empty host");
  if (portText.empty() || portText.size() > 5 ||
      !std::all_of(portText.begin(), portText.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return fail("port is not a number");
  const long port = std::stol(portText);
  if (port > 65535) return fail("port out of range");

  if (auto numeric = parseNumeric(host, static_cast<uint16_t>(port))) return *numeric;

  // A host name (NCCL_COMM_ID=node01:5000): resolve once, first answer wins.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) return fail(std::string("cannot resolve host: ") + ::gai_strerror(rc));
  SocketAddress result(found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  result.setPort(static_cast<uint16_t>(port));
  return result;
}

SocketAddress SocketAddress::fromBytes(int family, const uint8_t* ipBytes, uint16_t port) {
  if (family == AF_INET) {
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    v4.sin_port = htons(port);
    std::memcpy(&v4.sin_addr, ipBytes, 4);
    return SocketAddress(reinterpret_cast<const sockaddr*>(&v4), sizeof(v4));
  }
  if (family == AF_INET6) {
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(port);
    std::memcpy(&v6.sin6_addr, ipBytes, 16);
    return SocketAddress(reinterpret_cast<const sockaddr*>(&v6), sizeof(v6));
  }
  throwInvalidArgument("unsupported address family " + std::to_string(family) + " (expected AF_INET or AF_INET6)");
}

SocketAddress SocketAddress::any(int family, uint16_t port) {
  const uint8_t zeros[16] = {};
  return fromBytes(family, zeros, port);
}

uint16_t SocketAddress::port() const noexcept {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t port) noexcept {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

std::vector<uint8_t> SocketAddress::ipBytes() const {
  if (family() == AF_INET) {
    const auto* in = &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr;
    const auto* bytes = reinterpret_cast<const uint8_t*>(in);
    return {bytes, bytes + 4};
  }
  if (family() == AF_INET6) {
    const auto* in = &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr;
    const auto* bytes = reinterpret_cast<const uint8_t*>(in);
    return {bytes, bytes + 16};
  }
  return {};
}

std::string SocketAddress::host() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, text, sizeof(text));
  else if (family() == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, text, sizeof(text));
  else
    return "<no address>";
  return text;
}

std::string SocketAddress::toString() const {
  if (empty()) return "<no address>";
  if (family() == AF_INET6) return "[" + host() + "]:" + std::to_string(port());
  return host() + ":" + std::to_string(port());
}

bool SocketAddress::sameIp(const SocketAddress& other) const {
  return family() == other.family() && ipBytes() == other.ipBytes();
}

bool SocketAddress::inSubnet(const SocketAddress& network, int prefixLength) const {
  if (family() != network.family()) return false;
  const auto mine = ipBytes();
  const auto theirs = network.ipBytes();
  int bitsLeft = prefixLength;
  for (size_t i = 0; i < mine.size() && bitsLeft > 0; ++i, bitsLeft -= 8) {
    const uint8_t mask = bitsLeft >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bitsLeft));
    if ((mine[i] & mask) != (theirs[i] & mask)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Interfaces

namespace {

bool startsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

int prefixLengthOf(const sockaddr* netmask) {
  if (netmask == nullptr) return 0;
  SocketAddress mask(netmask, netmask->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  int bits = 0;
  for (uint8_t byte : mask.ipBytes()) bits += __builtin_popcount(byte);
  return bits;
}

bool isLinkLocalV6(const SocketAddress& address) {
  const auto bytes = address.ipBytes();
  return address.family() == AF_INET6 && bytes[0] == 0xfe && (bytes[1] & 0xc0) == 0x80;
}

}  // namespace

bool interfaceMatches(const std::string& spec, const std::string& interfaceName) {
  if (spec.empty()) return true;
  std::string list = spec;
  const bool exclude = list.front() == '^';
  if (exclude) list.erase(0, 1);
  const bool exact = !list.empty() && list.front() == '=';
  if (exact) list.erase(0, 1);
  bool listed = false;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string entry = list.substr(start, comma - start);
    if (!entry.empty() && (exact ? interfaceName == entry : startsWith(interfaceName, entry))) listed = true;
    start = comma + 1;
  }
  return exclude ? !listed : listed;
}

std::vector<NetworkInterface> listInterfaces() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) throwSystemError("getifaddrs failed while looking for a network interface");
  std::vector<NetworkInterface> found;
  for (ifaddrs* entry = all; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || !(entry->ifa_flags & IFF_UP)) continue;
    const int family = entry->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    NetworkInterface candidate;
    candidate.name = entry->ifa_name;
    candidate.address =
        SocketAddress(entry->ifa_addr, family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    candidate.address.setPort(0);
    if (isLinkLocalV6(candidate.address)) continue;
    candidate.prefixLength = prefixLengthOf(entry->ifa_netmask);
    found.push_back(std::move(candidate));
  }
  ::freeifaddrs(all);
  return found;
}

std::vector<NetworkInterface> orderInterfaces(std::vector<NetworkInterface> candidates, const std::string& spec,
                                              int family, const std::optional<SocketAddress>& commIdAddress) {
  std::erase_if(candidates, [&](const NetworkInterface& itf) {
    return (family != 0 && itf.address.family() != family) || !interfaceMatches(spec, itf.name);
  });
  // Lower class first; with an explicit spec every match is equally wanted (listing order).
  const auto classOf = [&](const NetworkInterface& itf) {
    if (!spec.empty()) return 0;
    if (startsWith(itf.name, "ib")) return 0;
    if (commIdAddress && commIdAddress->inSubnet(itf.address, itf.prefixLength)) return 1;
    if (startsWith(itf.name, "docker")) return 3;
    if (startsWith(itf.name, "lo")) return 4;
    if (startsWith(itf.name, "virbr")) return 5;
    return 2;
  };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const NetworkInterface& a, const NetworkInterface& b) {
    const int classA = classOf(a);
    const int classB = classOf(b);
    if (classA != classB) return classA < classB;
    return a.address.family() == AF_INET && b.address.family() == AF_INET6;
  });
  return candidates;
}

int configuredFamily() {
  const std::string text = params::kSocketFamily.get();
  if (text.empty()) return 0;
  if (text == "AF_INET" || text == "inet" || text == "4") return AF_INET;
  if (text == "AF_INET6" || text == "inet6" || text == "6") return AF_INET6;
  throwInvalidArgument(std::string(params::kSocketFamily.name()) + "='" + text + "' is not AF_INET or AF_INET6");
}

NetworkInterface selectInterface() {
  const std::string spec = params::kSocketIfname.get();
  const int family = configuredFamily();
  std::optional<SocketAddress> commId;
  const std::string commIdText = params::kCommId.get();
  if (!commIdText.empty()) commId = SocketAddress::parse(commIdText);

  const auto all = listInterfaces();
  const auto ordered = orderInterfaces(all, spec, family, commId);
  if (ordered.empty()) {
    std::string available;
    for (const auto& itf : all) available += (available.empty() ? "" : ", ") + itf.name + " " + itf.address.host();
    throwInvalidArgument(std::string("no network interface matches ") + params::kSocketIfname.name() + "='" + spec +
                         "'" + (family ? std::string(" with ") + params::kSocketFamily.name() + "=" +
                                             params::kSocketFamily.get()
                                       : std::string()) +
                         "; interfaces that are up: " + (available.empty() ? "none" : available));
  }
  TOPOCCL_INFO(log::kInit | log::kNet, "using network interface %s (%s)", ordered.front().name.c_str(),
               ordered.front().address.host().c_str());
  return ordered.front();
}

// ---------------------------------------------------------------------------------------------
// Opening sockets

void setNonBlocking(int fd, bool nonBlocking) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) throwSystemError("fcntl(F_GETFL) on socket " + std::to_string(fd) + " failed");
  const int wanted = nonBlocking ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (wanted != flags && ::fcntl(fd, F_SETFL, wanted) != 0)
    throwSystemError("fcntl(F_SETFL, O_NONBLOCK) on socket " + std::to_string(fd) + " failed");
}

void setNoDelay(int fd) {
  // Small control messages must not wait for Nagle's timer.
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    throwSystemError("setsockopt(TCP_NODELAY) on socket " + std::to_string(fd) + " failed");
}

Listener listenOn(const SocketAddress& address, bool reuseAddress, bool nonBlocking) {
  FileDescriptor fd(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throwSystemError("socket() for a listener on " + address.toString() + " failed");
  if (reuseAddress) {
    const int one = 1;
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
      throwSystemError("setsockopt(SO_REUSEADDR) for a listener on " + address.toString() + " failed");
  }
  if (::bind(fd.get(), address.raw(), address.length()) != 0)
    throwSystemError("bind() to " + address.toString() + " failed");
  if (::listen(fd.get(), SOMAXCONN) != 0) throwSystemError("listen() on " + address.toString() + " failed");
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0)
    throwSystemError("getsockname() on the listener for " + address.toString() + " failed");
  if (nonBlocking) setNonBlocking(fd.get(), true);
  return Listener{std::move(fd), SocketAddress(reinterpret_cast<sockaddr*>(&bound), length)};
}

FileDescriptor acceptConnection(int listenFd, bool nonBlocking, SocketAddress* peerOut, const std::string& what) {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int flags = SOCK_CLOEXEC | (nonBlocking ? SOCK_NONBLOCK : 0);
    FileDescriptor fd(::accept4(listenFd, reinterpret_cast<sockaddr*>(&peer), &length, flags));
    if (fd) {
      setNoDelay(fd.get());
      if (peerOut) *peerOut = SocketAddress(reinterpret_cast<sockaddr*>(&peer), length);
      return fd;
    }
    if (errno == EINTR) continue;
    // The connection died in the queue, or nothing is pending: nothing to hand back.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO) return {};
    throwSystemError(what + ": accept() failed");
  }
}

FileDescriptor startConnect(const SocketAddress& to, const std::string& what, const SocketAddress* from) {
  FileDescriptor fd(::socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) throwSystemError(what + ": socket() for a connection to " + to.toString() + " failed");
  setNoDelay(fd.get());
  if (from != nullptr && from->length() > 0 && from->family() == to.family() &&
      ::bind(fd.get(), from->raw(), from->length()) != 0)
    throwSystemError(what + ": cannot bind the connection to " + to.toString() + " to local address " + from->host() +
                     " (is that interface up on this host?)");
  while (::connect(fd.get(), to.raw(), to.length()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINPROGRESS) break;
    // Refusals and the like surface through finishConnect so callers handle them in one place;
    // stash the error by leaving the socket unconnected and reporting via SO_ERROR.
    if (errno == ECONNREFUSED || errno == ENETUNREACH || errno == EHOSTUNREACH || errno == ETIMEDOUT ||
        errno == EAGAIN)
      break;
    throwSystemError(what + ": connect() to " + to.toString() + " failed");
  }
  return fd;
}

int finishConnect(int fd) {
  int error = 0;
  socklen_t length = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
  if (error != 0) return error;
  // SO_ERROR is 0 both for "connected" and for "a synchronous failure already consumed"; ask the
  // kernel whether there really is a peer.
  sockaddr_storage peer{};
  socklen_t peerLength = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLength) != 0) return ECONNREFUSED;
  return 0;
}

int millisecondsUntil(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

// ---------------------------------------------------------------------------------------------
// Blocking helpers

namespace {

// Polls one fd until `events` or the deadline. Returns false on timeout.
bool waitFor(int fd, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    pollfd entry{fd, events, 0};
    // Round up so a deadline 0.4 ms away does not spin with timeout 0.
    const int timeout = Clock::now() >= deadline ? 0 : std::max(1, millisecondsUntil(deadline));
    const int rc = ::poll(&entry, 1, timeout);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throwSystemError(what + ": poll() failed");
  }
}

}  // namespace

FileDescriptor connectUntil(const SocketAddress& to, Deadline deadline, const std::string& what) {
  auto backoff = std::chrono::milliseconds(10);
  int lastError = 0;
  for (;;) {
    FileDescriptor fd = startConnect(to, what);
    if (waitFor(fd.get(), POLLOUT, deadline, what)) {
      lastError = finishConnect(fd.get());
      if (lastError == 0) return fd;
      const bool transient = lastError == ECONNREFUSED || lastError == ETIMEDOUT || lastError == ENETUNREACH ||
                             lastError == EHOSTUNREACH || lastError == EAGAIN || lastError == ECONNRESET;
      if (!transient)
        throw Error(ncclSystemError, what + ": connect() to " + to.toString() + " failed: " + std::strerror(lastError));
    } else {
      lastError = ETIMEDOUT;
    }
    if (Clock::now() + backoff >= deadline)
      throw Error(ncclRemoteError, what + ": could not connect to " + to.toString() + " before the deadline (" +
                                       std::strerror(lastError) + "); is the peer running and reachable?");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

void sendAll(int fd, const void* data, size_t bytes, Deadline deadline, const std::string& what) {
  const auto* cursor = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    if (!waitFor(fd, POLLOUT, deadline, what))
      throw Error(ncclRemoteError, what + ": timed out sending " + std::to_string(bytes) + " bytes (" +
                                       std::to_string(left) + " not yet taken by the peer)");
    iovec part{const_cast<char*>(cursor), left};
    const IoResult result = sendSome(fd, &part, 1, what);
    if (result.peerGone) throw Error(ncclRemoteError, what + ": peer " + describePeerGone(result) + " during send");
    cursor += result.bytes;
    left -= result.bytes;
  }
}

void recvAll(int fd, void* data, size_t bytes, Deadline deadline, const std::string& what) {
  auto* cursor = static_cast<char*>(data);
  size_t left = bytes;
  while (left > 0) {
    if (!waitFor(fd, POLLIN, deadline, what))
      throw Error(ncclRemoteError, what + ": timed out waiting for " + std::to_string(bytes) + " bytes (" +
                                       std::to_string(bytes - left) + " arrived)");
    const IoResult result = recvSome(fd, cursor, left, what);
    if (result.peerGone) throw Error(ncclRemoteError, what + ": peer " + describePeerGone(result) + " during receive");
    cursor += result.bytes;
    left -= result.bytes;
  }
}

// ---------------------------------------------------------------------------------------------
// Non-blocking helpers

namespace {

bool meansPeerGone(int error) {
  return error == ECONNRESET || error == EPIPE || error == ECONNABORTED || error == ETIMEDOUT ||
         error == EHOSTUNREACH || error == ENETUNREACH || error == ENOTCONN || error == ECONNREFUSED;
}

}  // namespace

IoResult sendSome(int fd, const iovec* parts, int count, const std::string& what) {
  IoResult result;
  msghdr message{};
  message.msg_iov = const_cast<iovec*>(parts);
  message.msg_iovlen = static_cast<size_t>(count);
  for (;;) {
    // MSG_NOSIGNAL: a vanished peer must be an error we report, not SIGPIPE killing the process.
    const ssize_t sent = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) {
      result.bytes = static_cast<size_t>(sent);
      return result;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return result;
    if (meansPeerGone(errno)) {
      result.peerGone = true;
      result.error = errno;
      return result;
    }
    throwSystemError(what + ": sendmsg() failed");
  }
}

IoResult recvSome(int fd, void* data, size_t bytes, const std::string& what) {
  IoResult result;
  if (bytes == 0) return result;
  for (;;) {
    const ssize_t got = ::recv(fd, data, bytes, MSG_DONTWAIT);
    if (got > 0) {
      result.bytes = static_cast<size_t>(got);
      return result;
    }
    if (got == 0) {
      result.peerGone = true;
      return result;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return result;
    if (meansPeerGone(errno)) {
      result.peerGone = true;
      result.error = errno;
      return result;
    }
    throwSystemError(what + ": recv() failed");
  }
}

std::string describePeerGone(const IoResult& result) {
  if (result.error == 0) return "closed the connection";
  return std::string("closed the connection (") + std::strerror(result.error) + ")";
}

}  // namespace topoccl::bootstrap

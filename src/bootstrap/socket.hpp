// TCP plumbing shared by the bootstrap and the socket transport: owning file descriptors, IPv4 /
// IPv6 addresses as "ip:port", interface selection (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY),
// listeners on ephemeral ports, blocking helpers bounded by a deadline, and non-blocking helpers
// that report a vanished peer instead of throwing, so callers can name the rank in the error.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace topoccl::bootstrap {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Owns one file descriptor; closes it exactly once.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  ~FileDescriptor() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }
  int release() noexcept;
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

// An IPv4 or IPv6 socket address. Text form: "10.0.0.1:5000" or "[fd00::2]:5000".
class SocketAddress {
 public:
  SocketAddress() = default;
  SocketAddress(const sockaddr* address, socklen_t length);

  // Accepts "ipv4:port", "[ipv6]:port" and "hostname:port" (resolved once). Throws
  // ncclInvalidArgument naming the text when it cannot be understood.
  static SocketAddress parse(const std::string& hostPort);
  // From raw IP bytes (4 for IPv4, 16 for IPv6) and a host-order port.
  static SocketAddress fromBytes(int family, const uint8_t* ipBytes, uint16_t port);
  // The wildcard address (0.0.0.0 or ::) of a family, for binding.
  static SocketAddress any(int family, uint16_t port);

  bool empty() const noexcept { return length_ == 0; }
  int family() const noexcept { return storage_.ss_family; }
  uint16_t port() const noexcept;
  void setPort(uint16_t port) noexcept;
  // IP bytes in network order: 4 for IPv4, 16 for IPv6.
  std::vector<uint8_t> ipBytes() const;
  std::string host() const;      // "10.0.0.1" or "fd00::2"
  std::string toString() const;  // "10.0.0.1:5000" or "[fd00::2]:5000"
  const sockaddr* raw() const noexcept { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const noexcept { return length_; }
  bool sameIp(const SocketAddress& other) const;
  // Whether this address lies in `network`/`prefixLength` (same family only).
  bool inSubnet(const SocketAddress& network, int prefixLength) const;

 private:
  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

struct NetworkInterface {
  std::string name;
  SocketAddress address;  // port 0
  int prefixLength = 0;   // from the netmask, to find "the interface on the NCCL_COMM_ID subnet"
};

// NCCL_SOCKET_IFNAME matching: a comma list of prefixes; a leading '^' turns it into an exclude
// list; a leading '=' (after any '^') makes every entry an exact name. An empty spec matches all.
bool interfaceMatches(const std::string& spec, const std::string& interfaceName);

// Every up interface address from getifaddrs (IPv4 and IPv6; link-local IPv6 is skipped because
// it needs a scope id that "ip:port" cannot carry).
std::vector<NetworkInterface> listInterfaces();

// Orders candidates the way NCCL does. With a spec: the matching ones, in listing order. Without:
// ib*, then the interface on `commIdAddress`'s subnet, then everything except docker* / lo* /
// virbr*, then docker*, lo*, virbr*. `family` (AF_INET, AF_INET6 or 0 for both) filters first;
// IPv4 sorts before IPv6 within a class. Pure, so tests can feed it made-up interfaces.
std::vector<NetworkInterface> orderInterfaces(std::vector<NetworkInterface> candidates, const std::string& spec,
                                              int family, const std::optional<SocketAddress>& commIdAddress);

// The interface bootstrap and the socket transport bind to, honouring NCCL_SOCKET_IFNAME,
// NCCL_SOCKET_FAMILY and NCCL_COMM_ID. Throws ncclInvalidArgument listing the interfaces that do
// exist when the settings match none.
NetworkInterface selectInterface();
// NCCL_SOCKET_FAMILY as AF_INET / AF_INET6, or 0 when unset. Throws naming the variable otherwise.
int configuredFamily();

// Opening sockets. Every fd is close-on-exec so forked / exec'ed children do not keep them open.
struct Listener {
  FileDescriptor fd;
  SocketAddress address;  // with the port the kernel chose
};
// Binds `address` (port 0: ephemeral) and listens. `reuseAddress` for fixed ports (NCCL_COMM_ID)
// that a previous run may have left in TIME_WAIT.
Listener listenOn(const SocketAddress& address, bool reuseAddress, bool nonBlocking);
// Accepts one pending connection, or returns an invalid fd when none is pending (non-blocking
// listener). The accepted socket gets TCP_NODELAY; `nonBlocking` sets O_NONBLOCK on it.
FileDescriptor acceptConnection(int listenFd, bool nonBlocking, SocketAddress* peerOut, const std::string& what);
// socket() + non-blocking connect(); returns at once (EINPROGRESS is normal). Fatal local errors
// throw ncclSystemError; a refusal shows up later in finishConnect.
// `from` (port 0) binds the source address first, so the connection leaves through that interface.
FileDescriptor startConnect(const SocketAddress& to, const std::string& what, const SocketAddress* from = nullptr);
// After the socket polled writable: 0 when connected, else the errno of the failed attempt.
int finishConnect(int fd);

void setNonBlocking(int fd, bool nonBlocking);
void setNoDelay(int fd);

// Milliseconds left until `deadline`, clamped to [0, INT_MAX] for poll().
int millisecondsUntil(Deadline deadline);

// Blocking helpers bounded by a deadline. `what` names the operation and the peer, e.g.
// "bootstrap rank 2 -> root 10.0.0.1:5000"; every error message starts with it. A refused or
// unreachable address is retried until the deadline (the peer may not listen yet).
FileDescriptor connectUntil(const SocketAddress& to, Deadline deadline, const std::string& what);
// Peer closed / reset or deadline passed -> ncclRemoteError; local failures -> ncclSystemError.
// The fd may be blocking or not; these poll before every attempt.
void sendAll(int fd, const void* data, size_t bytes, Deadline deadline, const std::string& what);
void recvAll(int fd, void* data, size_t bytes, Deadline deadline, const std::string& what);

// Non-blocking helpers: move what the kernel takes now and never wait.
struct IoResult {
  size_t bytes = 0;       // moved by this call
  bool peerGone = false;  // orderly close (recv returned 0) or reset / broken pipe
  int error = 0;          // errno behind peerGone, 0 for an orderly close
};
// Errors that mean "the other side is gone" come back as peerGone; anything else is a local
// failure and throws ncclSystemError naming `what` and the syscall.
IoResult sendSome(int fd, const iovec* parts, int count, const std::string& what);
IoResult recvSome(int fd, void* data, size_t bytes, const std::string& what);

// A phrase for a vanished peer: "closed the connection", plus the errno text after a reset.
std::string describePeerGone(const IoResult& result);

}  // namespace topoccl::bootstrap

// The bootstrap root: one thread, one rendezvous. It collects every rank's hello, checks it, and
// either sends all ranks the table of listener addresses or sends every rank the same error.
#include <poll.h>

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "bootstrap/protocol.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

namespace topoccl::bootstrap::detail {
namespace {

// A connection whose hello has not fully arrived yet.
struct PendingHello {
  FileDescriptor fd;
  SocketAddress from;
  wire::RootHello hello;
  size_t received = 0;
  Deadline giveUpAt;
};

// A rank that presented a valid hello and waits for the table.
struct Arrival {
  FileDescriptor fd;
  std::string listenAddress;
};

// Strangers that connect and say nothing are dropped after this long.
constexpr auto kHelloPatience = std::chrono::seconds(10);
// Replies are tiny; a rank that does not take one within this is treated as gone.
constexpr auto kReplyPatience = std::chrono::seconds(5);

class Root {
 public:
  Root(Listener listener, uint64_t secret) : listener_(std::move(listener)), secret_(secret) {
    name_ = "bootstrap root " + listener_.address.toString();
  }

  // Never throws: a root that hits trouble tells the ranks (if it can) and logs, but must not take
  // down the process that happens to host it.
  void run() noexcept {
    try {
      serve();
    } catch (const std::exception& e) {
      TOPOCCL_WARN("%s: stopped: %s", name_.c_str(), e.what());
      try {
        if (!failed()) fail(ncclInternalError, name_ + " stopped unexpectedly: " + e.what());
      } catch (...) {
      }
    } catch (...) {
      TOPOCCL_WARN("%s: stopped on an unknown exception", name_.c_str());
    }
  }

 private:
  bool failed() const { return !failure_.empty(); }
  int arrivedCount() const {
    int count = 0;
    for (const auto& arrival : arrivals_) count += arrival.fd.valid() ? 1 : 0;
    return count;
  }

  void serve() {
    TOPOCCL_INFO(log::kBootstrap, "%s: waiting for ranks", name_.c_str());
    for (;;) {
      if (!failed() && nranks_ > 0 && arrivedCount() == nranks_) {
        sendTables();
        return;
      }
      if (deadline_ && Clock::now() >= *deadline_) {
        if (!failed()) failOnMissingRanks();
        return;  // failed: every rank that could be told was told
      }

      std::vector<pollfd> polled;
      polled.push_back({listener_.fd.get(), POLLIN, 0});
      for (const auto& pending : pending_) polled.push_back({pending.fd.get(), POLLIN, 0});
      // Ranks send nothing after their hello, so readability on an arrival means it went away.
      for (const auto& arrival : arrivals_)
        if (arrival.fd) polled.push_back({arrival.fd.get(), POLLIN, 0});

      int timeout = 1000;  // wake up now and then to drop silent strangers
      if (deadline_) timeout = std::min(timeout, std::max(1, millisecondsUntil(*deadline_)));
      const int rc = ::poll(polled.data(), polled.size(), timeout);
      if (rc < 0 && errno != EINTR) throwSystemError(name_ + ": poll() failed");

      if (rc > 0) {
        // Readiness of arrivals first: indices below refer to the vectors as polled.
        size_t index = 1 + pending_.size();
        for (int rank = 0; rank < static_cast<int>(arrivals_.size()); ++rank) {
          if (!arrivals_[rank].fd) continue;
          if (polled[index++].revents != 0 && !failed())
            fail(ncclRemoteError, name_ + ": rank " + std::to_string(rank) + " (" + arrivals_[rank].listenAddress +
                                      ") disconnected from the root before all ranks arrived");
        }
        for (size_t i = pending_.size(); i-- > 0;)
          if (polled[1 + i].revents != 0) readHello(i);
        if (polled[0].revents != 0) acceptAll();
      }
      dropSilentStrangers();
    }
  }

  void acceptAll() {
    for (;;) {
      SocketAddress from;
      FileDescriptor fd = acceptConnection(listener_.fd.get(), true, &from, name_);
      if (!fd) return;
      pending_.push_back(PendingHello{std::move(fd), from, {}, 0, Clock::now() + kHelloPatience});
    }
  }

  void dropSilentStrangers() {
    const auto now = Clock::now();
    std::erase_if(pending_, [&](const PendingHello& pending) {
      if (now < pending.giveUpAt) return false;
      TOPOCCL_WARN("%s: dropped %s: no hello within %lld s", name_.c_str(), pending.from.toString().c_str(),
                   static_cast<long long>(kHelloPatience.count()));
      return true;
    });
  }

  void readHello(size_t index) {
    PendingHello& pending = pending_[index];
    auto* bytes = reinterpret_cast<char*>(&pending.hello);
    const IoResult result = recvSome(pending.fd.get(), bytes + pending.received,
                                     sizeof(pending.hello) - pending.received, name_);
    pending.received += result.bytes;
    if (result.peerGone) {
      TOPOCCL_WARN("%s: %s %s before finishing its hello; dropped", name_.c_str(), pending.from.toString().c_str(),
                   describePeerGone(result).c_str());
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(index));
      return;
    }
    if (pending.received < sizeof(pending.hello)) return;
    PendingHello complete = std::move(pending);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(index));
    admit(std::move(complete));
  }

  void admit(PendingHello&& pending) {
    const wire::RootHello& hello = pending.hello;
    const std::string from = pending.from.toString();
    if (hello.magic != wire::kRootHelloMagic) {
      TOPOCCL_WARN("%s: dropped a connection from %s that is not a topoccl rank (bad magic)", name_.c_str(),
                   from.c_str());
      return;
    }
    const std::string who = "rank " + std::to_string(hello.rank) + " (" + from + ")";
    if (hello.secret != secret_) {
      TOPOCCL_WARN("%s: refused %s: wrong secret", name_.c_str(), who.c_str());
      reply(pending.fd, ncclInvalidUsage,
            name_ + " refused " + who +
                ": wrong secret; this root serves a different unique id (stale id, or an id from another job?)",
            who);
      return;
    }
    if (!deadline_) {
      const auto patience = hello.timeoutMs > 0 ? std::chrono::milliseconds(hello.timeoutMs)
                                                : std::chrono::milliseconds(params::kTimeoutMs.get());
      deadline_ = Clock::now() + patience;
      timeoutMs_ = static_cast<long long>(patience.count());
    }
    if (failed()) {
      reply(pending.fd, failureCode_, failure_, who);
      return;
    }

    Arrival arrival{std::move(pending.fd), wire::loadAddress(hello.listenAddress)};
    if (hello.nranks <= 0) {
      offender_ = std::move(arrival);
      return fail(ncclInvalidArgument, name_ + ": " + who + " asked for nranks=" + std::to_string(hello.nranks) +
                                           "; nranks must be at least 1");
    }
    if (nranks_ == 0) {
      nranks_ = hello.nranks;
      firstRank_ = hello.rank;
      arrivals_.resize(static_cast<size_t>(nranks_));
    }
    if (hello.nranks != nranks_) {
      offender_ = std::move(arrival);
      return fail(ncclInvalidUsage, name_ + ": nranks mismatch: " + who + " says nranks=" +
                                        std::to_string(hello.nranks) + " but rank " + std::to_string(firstRank_) +
                                        " said nranks=" + std::to_string(nranks_));
    }
    if (hello.rank < 0 || hello.rank >= nranks_) {
      offender_ = std::move(arrival);
      return fail(ncclInvalidArgument, name_ + ": rank " + std::to_string(hello.rank) + " (" + from +
                                           ") is out of range for nranks=" + std::to_string(nranks_));
    }
    if (arrivals_[hello.rank].fd) {
      offender_ = std::move(arrival);
      return fail(ncclInvalidUsage, name_ + ": duplicate rank: rank " + std::to_string(hello.rank) +
                                        " joined twice (listening on " + arrivals_[hello.rank].listenAddress + " and on " +
                                        offender_.listenAddress + ")");
    }
    TOPOCCL_INFO(log::kBootstrap, "%s: rank %d/%d arrived (listens on %s)", name_.c_str(), hello.rank, nranks_,
                 arrival.listenAddress.c_str());
    arrivals_[hello.rank] = std::move(arrival);
  }

  void failOnMissingRanks() {
    std::string missing;
    int count = 0;
    for (int rank = 0; rank < nranks_; ++rank) {
      if (arrivals_[rank].fd) continue;
      if (count++ < 32) missing += (missing.empty() ? "" : ", ") + std::to_string(rank);
    }
    if (count > 32) missing += ", ... (" + std::to_string(count) + " in all)";
    fail(ncclRemoteError, name_ + ": rank" + (count == 1 ? " " : "s ") + missing + " never arrived within " +
                              std::to_string(timeoutMs_) + " ms (" + std::to_string(nranks_ - count) + " of " +
                              std::to_string(nranks_) + " ranks joined)");
  }

  // Tells every rank seen so far (and the offender) what went wrong; later arrivals hear the same
  // until the deadline, so no rank of this rendezvous waits out its timeout for nothing.
  void fail(ncclResult_t code, const std::string& message) {
    TOPOCCL_WARN("%s", message.c_str());
    failure_ = message;
    failureCode_ = code;
    for (int rank = 0; rank < static_cast<int>(arrivals_.size()); ++rank) {
      if (!arrivals_[rank].fd) continue;
      reply(arrivals_[rank].fd, code, message, "rank " + std::to_string(rank));
      arrivals_[rank].fd.reset();
    }
    if (offender_.fd) reply(offender_.fd, code, message, "the offending rank");
    offender_.fd.reset();
  }

  void reply(const FileDescriptor& fd, ncclResult_t code, const std::string& payload, const std::string& who) {
    wire::RootReply header{wire::kRootReplyMagic, static_cast<int32_t>(code), static_cast<uint32_t>(payload.size())};
    try {
      const auto deadline = Clock::now() + kReplyPatience;
      sendAll(fd.get(), &header, sizeof(header), deadline, name_ + " reply to " + who);
      sendAll(fd.get(), payload.data(), payload.size(), deadline, name_ + " reply to " + who);
    } catch (const Error& e) {
      // That rank is gone; the others still deserve their answer.
      TOPOCCL_WARN("%s", e.what());
    }
  }

  void sendTables() {
    std::string table(static_cast<size_t>(nranks_) * wire::kAddressChars, '\0');
    for (int rank = 0; rank < nranks_; ++rank) {
      const std::string& address = arrivals_[rank].listenAddress;
      table.replace(static_cast<size_t>(rank) * wire::kAddressChars,
                    std::min(address.size(), wire::kAddressChars - 1), address, 0, wire::kAddressChars - 1);
    }
    for (int rank = 0; rank < nranks_; ++rank) reply(arrivals_[rank].fd, ncclSuccess, table, "rank " + std::to_string(rank));
    TOPOCCL_INFO(log::kBootstrap, "%s: all %d ranks arrived; rendezvous done", name_.c_str(), nranks_);
  }

  Listener listener_;
  uint64_t secret_;
  std::string name_;
  std::vector<PendingHello> pending_;
  std::vector<Arrival> arrivals_;  // by rank; invalid fd = not arrived
  Arrival offender_;               // the rank whose hello caused the failure, until told
  int nranks_ = 0;
  int firstRank_ = -1;
  std::optional<Deadline> deadline_;  // from the first valid hello
  long long timeoutMs_ = 0;
  std::string failure_;
  ncclResult_t failureCode_ = ncclSuccess;
};

}  // namespace

SocketAddress startRoot(const SocketAddress& address, uint64_t secret, bool fixedPort) {
  Listener listener;
  try {
    listener = listenOn(address, fixedPort, true);
  } catch (const Error&) {
    // NCCL_COMM_ID may name this host by an address that is not on a local interface (NAT,
    // containers); the port on the wildcard address still receives those connections.
    if (!fixedPort) throw;
    listener = listenOn(SocketAddress::any(address.family(), address.port()), true, true);
  }
  const SocketAddress bound = listener.address;
  auto root = std::make_shared<Root>(std::move(listener), secret);
  try {
    std::thread([root] { root->run(); }).detach();
  } catch (const std::system_error& e) {
    throwSystemErrorNoErrno("bootstrap root " + bound.toString() + ": cannot start its thread: " + e.what());
  }
  return bound;
}

}  // namespace topoccl::bootstrap::detail

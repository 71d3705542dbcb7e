// Bootstrap::join and the rank-to-rank part: after the root's table, every rank keeps one listener
// and opens one outgoing connection per peer it sends to (lazily). Incoming bytes are parsed into
// messages keyed by (peer, kind, tag) whenever any call waits, so a blocked send never stops this
// rank from draining what others send it, and no send/recv order between ranks can deadlock.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <tuple>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/protocol.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

namespace topoccl::bootstrap {
namespace {

// The root answers at its deadline, which equals ours; this much longer we wait for its verdict
// (which names the missing ranks) before settling for a bare timeout.
constexpr auto kRootVerdictGrace = std::chrono::seconds(2);

using wire::MessageKind;

std::string kindText(MessageKind kind, int tag) {
  switch (kind) {
    case MessageKind::User: return "message tag " + std::to_string(tag);
    case MessageKind::AllGather: return "allGather data";
    case MessageKind::Barrier: return "barrier token";
  }
  return "message";
}

class DirectBootstrap final : public Bootstrap {
 public:
  DirectBootstrap(int rank, int nranks, uint64_t secret, std::chrono::milliseconds timeout, Listener listener,
                  std::vector<SocketAddress> peers)
      : rank_(rank),
        nranks_(nranks),
        secret_(secret),
        timeout_(timeout),
        listener_(std::move(listener)),
        peers_(std::move(peers)),
        outgoing_(static_cast<size_t>(nranks)),
        peerGone_(static_cast<size_t>(nranks)) {
    abortEvent_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!abortEvent_) throwSystemError(self() + ": eventfd() for abort signalling failed");
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }

  void allGather(void* data, size_t bytesPerRank) override {
    ringExchange(MessageKind::AllGather, static_cast<char*>(data), bytesPerRank);
  }

  void barrier() override {
    // Everyone has entered once a ring allgather of one byte per rank completes.
    std::vector<char> tokens(static_cast<size_t>(nranks_), 0);
    ringExchange(MessageKind::Barrier, tokens.data(), 1);
  }

  void send(int peer, int tag, const void* data, size_t bytes) override {
    checkPeer(peer, "send");
    sendMessage(peer, MessageKind::User, tag, data, bytes, Clock::now() + timeout_);
  }

  void recv(int peer, int tag, void* data, size_t bytes) override {
    checkPeer(peer, "recv");
    recvMessage(peer, MessageKind::User, tag, data, bytes, Clock::now() + timeout_);
  }

  void abort() override {
    aborted_.store(true);
    const uint64_t one = 1;
    // Wakes a poll() in progress on another thread; the flag makes every later call fail too.
    [[maybe_unused]] const ssize_t ignored = ::write(abortEvent_.get(), &one, sizeof(one));
  }

 private:
  // One accepted connection and the message being parsed from it.
  struct Incoming {
    enum class Stage { Hello, Header, Payload };
    FileDescriptor fd;
    SocketAddress from;
    int peer = -1;  // known once the hello arrived
    Stage stage = Stage::Hello;
    size_t received = 0;  // of the current hello, header or payload
    wire::PeerHello hello{};
    wire::MessageHeader header{};
    std::vector<char> payload;
  };
  using MessageKey = std::tuple<int, MessageKind, int>;  // peer, kind, tag

  std::string self() const { return "bootstrap rank " + std::to_string(rank_); }
  std::string peerName(int peer) const {
    return "rank " + std::to_string(peer) + " (" + peers_[static_cast<size_t>(peer)].toString() + ")";
  }
  std::string timeoutText() const { return std::to_string(timeout_.count()) + " ms"; }

  void checkPeer(int peer, const char* operation) const {
    if (peer < 0 || peer >= nranks_)
      throwInvalidArgument(self() + ": " + operation + " with peer " + std::to_string(peer) +
                           ", which is out of range for nranks=" + std::to_string(nranks_));
  }

  void throwIfAborted(const std::string& what) const {
    if (aborted_.load())
      throw Error(ncclSystemError, what + ": aborted (ncclCommAbort) before it could finish");
  }

  void ringExchange(MessageKind kind, char* data, size_t bytesPerRank) {
    throwIfAborted(self() + ": " + kindText(kind, 0));
    if (nranks_ == 1) return;
    const Deadline deadline = Clock::now() + timeout_;
    const int next = (rank_ + 1) % nranks_;
    const int previous = (rank_ + nranks_ - 1) % nranks_;
    // Step s forwards the slot received in step s-1; after nranks-1 steps every slot is filled.
    for (int step = 0; step < nranks_ - 1; ++step) {
      const size_t sendSlot = static_cast<size_t>((rank_ - step + nranks_) % nranks_);
      const size_t recvSlot = static_cast<size_t>((rank_ - step - 1 + nranks_) % nranks_);
      sendMessage(next, kind, 0, data + sendSlot * bytesPerRank, bytesPerRank, deadline);
      recvMessage(previous, kind, 0, data + recvSlot * bytesPerRank, bytesPerRank, deadline);
    }
  }

  void sendMessage(int peer, MessageKind kind, int tag, const void* data, size_t bytes, Deadline deadline) {
    const std::string what = self() + ": send of " + kindText(kind, tag) + " to " + peerName(peer);
    throwIfAborted(what);
    if (peer == rank_) {
      const auto* begin = static_cast<const char*>(data);
      arrived_[{peer, kind, tag}].emplace_back(begin, begin + bytes);
      return;
    }
    const int fd = connectedFd(peer, deadline, what);
    wire::MessageHeader header{static_cast<uint32_t>(kind), tag, bytes};
    iovec parts[2] = {{&header, sizeof(header)}, {const_cast<void*>(data), bytes}};
    writeFully(peer, fd, parts, 2, deadline, what);
  }

  void recvMessage(int peer, MessageKind kind, int tag, void* data, size_t bytes, Deadline deadline) {
    const std::string what = self() + ": receive of " + kindText(kind, tag) + " from " + peerName(peer);
    for (;;) {
      throwIfAborted(what);
      auto found = arrived_.find({peer, kind, tag});
      if (found != arrived_.end() && !found->second.empty()) {
        std::vector<char> message = std::move(found->second.front());
        found->second.pop_front();
        if (message.size() != bytes)
          throw Error(ncclInvalidUsage, what + ": size mismatch: the sender sent " + std::to_string(message.size()) +
                                            " bytes, the receiver expected " + std::to_string(bytes));
        if (bytes > 0) std::memcpy(data, message.data(), bytes);
        return;
      }
      if (!peerGone_[static_cast<size_t>(peer)].empty())
        throw Error(ncclRemoteError, what + " failed: " + peerName(peer) + " " + peerGone_[static_cast<size_t>(peer)] +
                                         " (did that process exit or crash?)");
      if (Clock::now() >= deadline)
        throw Error(ncclRemoteError, what + ": timed out after " + timeoutText() + "; " + peerName(peer) +
                                         " sent nothing (is it stuck, or dead without closing its sockets?)");
      pump(deadline, -1, 0, what);
    }
  }

  // The outgoing connection to `peer`, dialled on first use. Keeps draining incoming traffic while
  // the handshake is in flight.
  int connectedFd(int peer, Deadline deadline, const std::string& what) {
    FileDescriptor& outgoing = outgoing_[static_cast<size_t>(peer)];
    if (outgoing) return outgoing.get();
    const SocketAddress& address = peers_[static_cast<size_t>(peer)];
    auto backoff = std::chrono::milliseconds(10);
    for (;;) {
      FileDescriptor fd = startConnect(address, what);
      bool writable = false;
      while (!(writable = pump(deadline, fd.get(), POLLOUT, what)) && Clock::now() < deadline) {
      }
      const int error = writable ? finishConnect(fd.get()) : ETIMEDOUT;
      if (error == 0) {
        wire::PeerHello hello{wire::kPeerHelloMagic, secret_, rank_, 0};
        iovec part{&hello, sizeof(hello)};
        writeFully(peer, fd.get(), &part, 1, deadline, what);
        outgoing = std::move(fd);
        return outgoing.get();
      }
      if (Clock::now() + backoff >= deadline)
        throw Error(ncclRemoteError, what + ": cannot connect to " + peerName(peer) + ": " + std::strerror(error) +
                                         " (is that rank still alive?)");
      const Deadline retryAt = Clock::now() + backoff;
      while (Clock::now() < retryAt) pump(retryAt, -1, 0, what);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
    }
  }

  void writeFully(int peer, int fd, iovec* parts, int count, Deadline deadline, const std::string& what) {
    int index = 0;
    while (index < count) {
      if (parts[index].iov_len == 0) {
        ++index;
        continue;
      }
      const IoResult result = sendSome(fd, parts + index, count - index, what);
      if (result.peerGone) {
        outgoing_[static_cast<size_t>(peer)].reset();
        throw Error(ncclRemoteError, what + " failed: " + peerName(peer) + " " + describePeerGone(result) +
                                         " (did that process exit or crash?)");
      }
      size_t advanced = result.bytes;
      while (index < count && advanced >= parts[index].iov_len) {
        advanced -= parts[index].iov_len;
        ++index;
      }
      if (index < count) {
        parts[index].iov_base = static_cast<char*>(parts[index].iov_base) + advanced;
        parts[index].iov_len -= advanced;
      }
      if (index < count && result.bytes == 0 && !pump(deadline, fd, POLLOUT, what) && Clock::now() >= deadline) {
        // Half a message is on the wire; this connection cannot carry another one.
        outgoing_[static_cast<size_t>(peer)].reset();
        throw Error(ncclRemoteError, what + ": timed out after " + timeoutText() + "; " + peerName(peer) +
                                         " stopped taking data");
      }
    }
  }

  // Waits until `extraFd` has `extraEvents`, something else arrives, abort() or the deadline, and
  // services the listener and every incoming connection on the way. Returns whether extraFd is ready.
  bool pump(Deadline deadline, int extraFd, short extraEvents, const std::string& what) {
    throwIfAborted(what);
    std::vector<pollfd> polled;
    polled.push_back({abortEvent_.get(), POLLIN, 0});
    polled.push_back({listener_.fd.get(), POLLIN, 0});
    const size_t incomingCount = incoming_.size();
    for (const auto& in : incoming_) polled.push_back({in.fd.get(), POLLIN, 0});
    if (extraFd >= 0) polled.push_back({extraFd, extraEvents, 0});

    const int timeout = Clock::now() >= deadline ? 0 : std::max(1, millisecondsUntil(deadline));
    const int rc = ::poll(polled.data(), polled.size(), timeout);
    if (rc < 0) {
      if (errno == EINTR) return false;
      throwSystemError(what + ": poll() failed");
    }
    throwIfAborted(what);
    if (rc == 0) return false;

    for (size_t i = incomingCount; i-- > 0;) {
      if (polled[2 + i].revents == 0) continue;
      if (!serviceIncoming(incoming_[i])) incoming_.erase(incoming_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (polled[1].revents != 0) acceptAll();
    return extraFd >= 0 && polled.back().revents != 0;
  }

  void acceptAll() {
    for (;;) {
      Incoming in;
      in.fd = acceptConnection(listener_.fd.get(), true, &in.from, self() + " listener");
      if (!in.fd) return;
      incoming_.push_back(std::move(in));
    }
  }

  // Reads what is available; returns false once the connection is finished with.
  bool serviceIncoming(Incoming& in) {
    for (;;) {
      char* target = nullptr;
      size_t wanted = 0;
      switch (in.stage) {
        case Incoming::Stage::Hello:
          target = reinterpret_cast<char*>(&in.hello);
          wanted = sizeof(in.hello);
          break;
        case Incoming::Stage::Header:
          target = reinterpret_cast<char*>(&in.header);
          wanted = sizeof(in.header);
          break;
        case Incoming::Stage::Payload:
          target = in.payload.data();
          wanted = in.payload.size();
          break;
      }
      if (in.received < wanted) {
        const IoResult result = recvSome(in.fd.get(), target + in.received, wanted - in.received, self());
        in.received += result.bytes;
        if (result.peerGone) {
          if (in.peer >= 0) {
            const bool midMessage = in.stage != Incoming::Stage::Header || in.received > 0;
            peerGone_[static_cast<size_t>(in.peer)] =
                describePeerGone(result) + (midMessage ? " in the middle of a message" : "");
          }
          return false;
        }
        if (in.received < wanted) return true;  // would block
      }
      in.received = 0;
      switch (in.stage) {
        case Incoming::Stage::Hello:
          if (in.hello.magic != wire::kPeerHelloMagic || in.hello.secret != secret_ || in.hello.rank < 0 ||
              in.hello.rank >= nranks_) {
            TOPOCCL_WARN("%s: refused a connection from %s: %s", self().c_str(), in.from.toString().c_str(),
                         in.hello.magic != wire::kPeerHelloMagic ? "not a topoccl bootstrap peer"
                         : in.hello.secret != secret_          ? "wrong secret"
                                                                : "rank out of range");
            return false;
          }
          in.peer = in.hello.rank;
          in.stage = Incoming::Stage::Header;
          break;
        case Incoming::Stage::Header: {
          const auto kind = static_cast<MessageKind>(in.header.kind);
          if ((kind != MessageKind::User && kind != MessageKind::AllGather && kind != MessageKind::Barrier) ||
              in.header.bytes > wire::kMaxMessageBytes) {
            TOPOCCL_WARN("%s: malformed message header from %s; dropping the connection", self().c_str(),
                         peerName(in.peer).c_str());
            peerGone_[static_cast<size_t>(in.peer)] = "sent a malformed message header";
            return false;
          }
          in.payload.assign(in.header.bytes, 0);
          in.stage = Incoming::Stage::Payload;
          break;
        }
        case Incoming::Stage::Payload:
          arrived_[{in.peer, static_cast<MessageKind>(in.header.kind), in.header.tag}].push_back(
              std::move(in.payload));
          in.payload = {};
          in.stage = Incoming::Stage::Header;
          break;
      }
    }
  }

  const int rank_;
  const int nranks_;
  const uint64_t secret_;
  const std::chrono::milliseconds timeout_;
  Listener listener_;
  std::vector<SocketAddress> peers_;        // bootstrap listeners, by rank
  std::vector<FileDescriptor> outgoing_;    // by rank; dialled on first send
  std::vector<std::string> peerGone_;       // by rank: why its connection to us ended, "" while fine
  std::vector<Incoming> incoming_;
  std::map<MessageKey, std::deque<std::vector<char>>> arrived_;  // received, not yet asked for
  FileDescriptor abortEvent_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<Bootstrap> Bootstrap::join(const UniqueId& id, int rank, int nranks,
                                           std::chrono::milliseconds timeout) {
  const SocketAddress root = detail::rootAddressOf(id);
  if (timeout.count() <= 0) timeout = std::chrono::milliseconds(params::kTimeoutMs.get());
  const Deadline deadline = Clock::now() + timeout;
  const std::string what = "bootstrap rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                           " joining root " + root.toString();

  // Our own listener exists before anyone can learn its address from the root's table.
  Listener listener = listenOn(selectInterface().address, false, true);
  if (detail::hostsCommIdRoot(id, rank)) detail::startRoot(root, id.secret, true);

  FileDescriptor toRoot = connectUntil(root, deadline, what);
  wire::RootHello hello;
  hello.magic = wire::kRootHelloMagic;
  hello.secret = id.secret;
  hello.rank = rank;
  hello.nranks = nranks;
  hello.timeoutMs = static_cast<uint32_t>(std::max(1, millisecondsUntil(deadline)));
  wire::storeAddress(hello.listenAddress, listener.address.toString());
  sendAll(toRoot.get(), &hello, sizeof(hello), deadline, what);

  pollfd waiting{toRoot.get(), POLLIN, 0};
  int rc = 0;
  while ((rc = ::poll(&waiting, 1, std::max(1, millisecondsUntil(deadline + kRootVerdictGrace)))) < 0 &&
         errno == EINTR) {
  }
  if (rc == 0)
    throw Error(ncclRemoteError, what + ": no answer from the root within " + std::to_string(timeout.count()) +
                                     " ms (root process dead or unreachable?)");
  const Deadline replyDeadline = Clock::now() + kRootVerdictGrace;
  wire::RootReply reply;
  recvAll(toRoot.get(), &reply, sizeof(reply), replyDeadline, what + ": reading the root's reply");
  const bool success = reply.result == ncclSuccess;
  const size_t expected = success ? static_cast<size_t>(std::max(nranks, 0)) * wire::kAddressChars : 0;
  if (reply.magic != wire::kRootReplyMagic || (success && reply.payloadBytes != expected) ||
      (!success && reply.payloadBytes > (64u << 10)))
    throw Error(ncclRemoteError, what + ": the root sent a malformed reply (is that address really a topoccl root?)");
  std::string payload(reply.payloadBytes, '\0');
  recvAll(toRoot.get(), payload.data(), payload.size(), replyDeadline, what + ": reading the root's reply");
  if (!success) throw Error(static_cast<ncclResult_t>(reply.result), payload);

  std::vector<SocketAddress> peers;
  peers.reserve(static_cast<size_t>(nranks));
  for (int peer = 0; peer < nranks; ++peer) {
    char slot[wire::kAddressChars];
    std::memcpy(slot, payload.data() + static_cast<size_t>(peer) * wire::kAddressChars, wire::kAddressChars);
    peers.push_back(SocketAddress::parse(wire::loadAddress(slot)));
  }
  TOPOCCL_INFO(log::kBootstrap, "bootstrap rank %d/%d joined via %s; listening on %s", rank, nranks,
               root.toString().c_str(), listener.address.toString().c_str());
  return std::make_unique<DirectBootstrap>(rank, nranks, id.secret, timeout, std::move(listener), std::move(peers));
}

}  // namespace topoccl::bootstrap

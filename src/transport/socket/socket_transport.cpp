#include "transport/socket/socket_transport.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "bootstrap/socket.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"

namespace topoccl::transport {

namespace socket_detail {

Stripe planStripe(size_t bytes, int nstreams) {
  Stripe stripe;
  if (nstreams <= 1 || bytes < kMinStripeBytes) {
    stripe.parts = 1;
    stripe.partBytes = bytes;
    return stripe;
  }
  const size_t perStream = (bytes + static_cast<size_t>(nstreams) - 1) / static_cast<size_t>(nstreams);
  stripe.partBytes = (perStream + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
  stripe.parts = static_cast<int>((bytes + stripe.partBytes - 1) / stripe.partBytes);
  return stripe;
}

size_t partOffset(const Stripe& stripe, int part) { return static_cast<size_t>(part) * stripe.partBytes; }

size_t partLength(const Stripe& stripe, size_t bytes, int part) {
  const size_t offset = partOffset(stripe, part);
  return offset >= bytes ? 0 : std::min(stripe.partBytes, bytes - offset);
}

}  // namespace socket_detail

namespace {

using bootstrap::Clock;
using bootstrap::Deadline;
using bootstrap::FileDescriptor;
using bootstrap::IoResult;
using bootstrap::SocketAddress;
using socket_detail::Stripe;

// First bytes the dialler sends on every stream, so the acceptor knows whose stream it is.
struct StreamHello {
  uint64_t magic = 0;
  uint64_t secret = 0;
  uint64_t commHash = 0;
  int32_t rank = -1;  // the dialler
  int32_t channel = -1;
  int32_t streamIndex = -1;
  int32_t nstreams = 0;  // the dialler's stream count; the acceptor adopts it
};
constexpr uint64_t kStreamHelloMagic = 0x746f706f2d736b21ull;  // "topo-sk!"

// Precedes every part of every message on the wire.
struct PartHeader {
  uint64_t magic = 0;
  uint64_t sequence = 0;    // message number on this connection and direction, from 0
  uint64_t totalBytes = 0;  // of the whole message, so a receiver can name both sizes
  uint64_t offset = 0;
  uint64_t length = 0;
};
constexpr uint64_t kPartMagic = 0x746f706f2d707421ull;  // "topo-pt!"

constexpr int kMaxStreams = 64;
constexpr size_t kStagingBytes = 256 << 10;  // per stream, only for receives that reduce
constexpr auto kHelloPatience = std::chrono::seconds(30);

// Loopback TCP is bound by the CPU that runs both ends' stacks: one stream per peer on the same host
// measured faster there than two (perf/RESULTS.md); NICs want several.
int configuredStreams(bool sameHost) {
  const int64_t wanted = params::kNSocks.get();
  if (wanted == 0) return sameHost ? 1 : 2;
  if (wanted < 1 || wanted > kMaxStreams)
    throwInvalidArgument(std::string(params::kNSocks.name()) + "=" + std::to_string(wanted) + " is out of range [0, " +
                         std::to_string(kMaxStreams) + "] (0: automatic)");
  return static_cast<int>(wanted);
}

// The transport's listener and the streams accepted on it that no Connection has claimed yet.
// Shared by the transport and its connections, so either may be destroyed first.
class AcceptHub {
 public:
  struct Arrived {
    FileDescriptor fd;
    StreamHello hello;
  };

  AcceptHub(const CommIdentity& identity, bootstrap::Listener listener)
      : identity_(identity), listener_(std::move(listener)) {
    name_ = "socket transport rank " + std::to_string(identity.rank) + " listener " + listener_.address.toString();
  }

  const SocketAddress& address() const { return listener_.address; }

  // Accepts what is pending and reads hellos as far as they have arrived. Never blocks.
  void poll() {
    std::lock_guard lock(mutex_);
    for (;;) {
      SocketAddress from;
      FileDescriptor fd = bootstrap::acceptConnection(listener_.fd.get(), true, &from, name_);
      if (!fd) break;
      pending_.push_back(Pending{std::move(fd), from, {}, 0, Clock::now() + kHelloPatience});
    }
    const auto now = Clock::now();
    std::erase_if(pending_, [&](Pending& pending) { return readHello(pending, now); });
  }

  // Hands over every parked stream from (rank, channel).
  std::vector<Arrived> take(int rank, int channel) {
    std::lock_guard lock(mutex_);
    auto found = parked_.find({rank, channel});
    if (found == parked_.end()) return {};
    std::vector<Arrived> streams = std::move(found->second);
    parked_.erase(found);
    return streams;
  }

 private:
  struct Pending {
    FileDescriptor fd;
    SocketAddress from;
    StreamHello hello;
    size_t received = 0;
    Deadline giveUpAt;
  };

  // Returns true when `pending` is finished with (parked or dropped).
  bool readHello(Pending& pending, Deadline now) {
    auto* bytes = reinterpret_cast<char*>(&pending.hello);
    const IoResult result =
        bootstrap::recvSome(pending.fd.get(), bytes + pending.received, sizeof(pending.hello) - pending.received, name_);
    pending.received += result.bytes;
    const std::string from = pending.from.toString();
    if (result.peerGone) {
      TOPOCCL_WARN("%s: %s %s before finishing its hello; dropped", name_.c_str(), from.c_str(),
                   bootstrap::describePeerGone(result).c_str());
      return true;
    }
    if (pending.received < sizeof(pending.hello)) {
      if (now < pending.giveUpAt) return false;
      TOPOCCL_WARN("%s: dropped %s: no complete hello within %lld s", name_.c_str(), from.c_str(),
                   static_cast<long long>(kHelloPatience.count()));
      return true;
    }
    const StreamHello& hello = pending.hello;
    const char* refusal = nullptr;
    if (hello.magic != kStreamHelloMagic) refusal = "not a topoccl socket stream";
    else if (hello.secret != identity_.secret) refusal = "wrong secret";
    else if (hello.commHash != identity_.commHash) refusal = "it belongs to another communicator";
    else if (hello.rank < 0 || hello.rank >= identity_.nranks) refusal = "rank out of range";
    else if (hello.channel < 0 || hello.nstreams < 1 || hello.nstreams > kMaxStreams || hello.streamIndex < 0 ||
             hello.streamIndex >= hello.nstreams)
      refusal = "malformed channel or stream numbers";
    if (refusal) {
      TOPOCCL_WARN("%s: refused a connection from %s: %s", name_.c_str(), from.c_str(), refusal);
      return true;
    }
    TOPOCCL_TRACE(log::kNet, "%s: stream %d/%d from rank %d channel %d arrived", name_.c_str(), hello.streamIndex,
                  hello.nstreams, hello.rank, hello.channel);
    parked_[{hello.rank, hello.channel}].push_back(Arrived{std::move(pending.fd), hello});
    return true;
  }

  const CommIdentity identity_;
  bootstrap::Listener listener_;
  std::string name_;
  std::mutex mutex_;
  std::vector<Pending> pending_;
  std::map<std::pair<int, int>, std::vector<Arrived>> parked_;
};

class SocketConnection final : public Connection {
 public:
  SocketConnection(std::shared_ptr<AcceptHub> hub, const CommIdentity& self, const PeerInfo& peer, int channel,
                   int streams)
      : hub_(std::move(hub)),
        self_(self),
        peerRank_(peer.rank),
        channel_(channel),
        dials_(self.rank <= peer.rank),
        accepts_(self.rank >= peer.rank) {
    peerName_ = "socket peer rank " + std::to_string(peer.rank) + " (" + peer.socketAddress + ")";
    connectTimeoutMs_ = params::kTimeoutMs.get();
    connectDeadline_ = Clock::now() + std::chrono::milliseconds(connectTimeoutMs_);
    if (dials_) {
      peerAddress_ = SocketAddress::parse(peer.socketAddress);
      setStreamCount(streams);
      for (int index = 0; index < nstreams_; ++index) startDial(index);
    }
  }

  Ticket postSend(const void* data, size_t bytes) override {
    SendMessage message;
    message.ticket = nextSendTicket_++;
    message.data = static_cast<const char*>(data);
    message.bytes = bytes;
    if (nstreams_ > 0) plan(message);
    sends_.push_back(message);
    return message.ticket;
  }

  Ticket postRecv(const RecvAction& action, size_t bytes) override {
    if (action.operand != nullptr) {
      if (action.reduce == nullptr || action.elementSize == 0 || socket_detail::kStripeAlign % action.elementSize != 0 ||
          bytes % action.elementSize != 0)
        throwInvalidArgument(describe() + ": receive with a reduction needs a reduce function and an element size "
                             "that divides both the byte count (" + std::to_string(bytes) + ") and " +
                             std::to_string(socket_detail::kStripeAlign) + " (got " +
                             std::to_string(action.elementSize) + ")");
    }
    RecvMessage message;
    message.ticket = nextRecvTicket_++;
    message.action = action;
    message.bytes = bytes;
    if (nstreams_ > 0) plan(message);
    recvs_.push_back(message);
    return message.ticket;
  }

  void progress() override {
    if (failure_) throw Error(failure_->code(), failure_->what());
    try {
      if (!ready_ && !finishSetup()) return;
      for (int index = 0; index < nstreams_; ++index) {
        progressSends(index);
        progressRecvs(index);
      }
      retireCompleted();
    } catch (const Error& e) {
      // A broken stream cannot be resynchronised; every later call reports the same failure, and
      // shutting the streams down makes the peer fail too instead of waiting for us.
      failure_.emplace(e);
      for (Stream& stream : streams_) {
        if (stream.fd) ::shutdown(stream.fd.get(), SHUT_RDWR);
        if (stream.selfIn) ::shutdown(stream.selfIn.get(), SHUT_RDWR);
      }
      throw;
    }
  }

  Ticket sendsCompleted() const override { return sendsCompleted_; }
  Ticket recvsCompleted() const override { return recvsCompleted_; }
  int peer() const override { return peerRank_; }
  const char* transportName() const override { return "socket"; }
  std::string describe() const override {
    return "socket to rank " + std::to_string(peerRank_) + peerName_.substr(peerName_.find(" (")) + " channel " +
           std::to_string(channel_) + (nstreams_ > 0 ? ", " + std::to_string(nstreams_) + " streams" : "");
  }

 private:
  struct SendMessage {
    Ticket ticket = 0;
    const char* data = nullptr;
    size_t bytes = 0;
    Stripe stripe;
    int partsLeft = 0;
  };
  struct RecvMessage {
    Ticket ticket = 0;
    RecvAction action;
    size_t bytes = 0;
    Stripe stripe;
    int partsLeft = 0;
    bool sizeConfirmed = false;  // part 0's header matched the posted size
  };
  // One TCP stream. A connection to oneself dials and accepts: it sends on `fd` and receives on
  // `selfIn`; otherwise both directions share `fd`.
  struct Stream {
    FileDescriptor fd;
    FileDescriptor selfIn;
    bool connected = false;  // dialled stream finished its handshake (accepted ones start true)
    Deadline retryAt{};
    StreamHello hello;  // dialler only: goes out before any part
    size_t helloSent = sizeof(StreamHello);
    // Send side: the part in flight.
    Ticket sendCursor = 1;
    bool sending = false;
    PartHeader sendHeader;
    size_t sendHeaderDone = 0;
    const char* sendPayload = nullptr;
    size_t sendPayloadLeft = 0;
    // Receive side: the part in flight.
    Ticket recvCursor = 1;
    bool receiving = false;
    PartHeader recvHeader;
    size_t recvHeaderDone = 0;
    size_t recvPayloadDone = 0;
    std::vector<char> staging;  // reduce receives land here first
    size_t stagingFill = 0;
    size_t reducedBytes = 0;  // of the current part

    int sendFd() const { return fd.get(); }
    int recvFd() const { return selfIn ? selfIn.get() : fd.get(); }
  };

  void setStreamCount(int count) {
    nstreams_ = count;
    streams_.resize(static_cast<size_t>(count));
    for (auto& message : sends_) plan(message);
    for (auto& message : recvs_) plan(message);
  }

  void plan(SendMessage& message) const {
    message.stripe = socket_detail::planStripe(message.bytes, nstreams_);
    message.partsLeft = message.stripe.parts;
  }
  void plan(RecvMessage& message) const {
    message.stripe = socket_detail::planStripe(message.bytes, nstreams_);
    message.partsLeft = message.stripe.parts;
  }

  // Which part of message `ticket` stream `index` carries, or -1.
  int partOnStream(Ticket ticket, int parts, int index) const {
    const int first = static_cast<int>((ticket - 1) % static_cast<Ticket>(nstreams_));
    const int part = (index - first + nstreams_) % nstreams_;
    return part < parts ? part : -1;
  }

  [[noreturn]] void failRemote(const std::string& message) const { throw Error(ncclRemoteError, message); }

  // ------------------------------------------------------------------------------------------
  // Setup: dialling (lower rank) or collecting accepted streams (higher rank).

  void startDial(int index) {
    Stream& stream = streams_[static_cast<size_t>(index)];
    stream.fd = bootstrap::startConnect(peerAddress_, describe());
    stream.connected = false;
    stream.hello = StreamHello{kStreamHelloMagic, self_.secret, self_.commHash, self_.rank, channel_, index, nstreams_};
    stream.helloSent = 0;
  }

  bool finishSetup() {
    bool allThere = true;
    if (dials_) {
      for (int index = 0; index < nstreams_; ++index) allThere = pollDial(index) && allThere;
    }
    if (accepts_) {
      const bool accepted = collectAccepted();
      if (!accepted && Clock::now() >= connectDeadline_)
        failRemote(describe() + ": " + peerName_ + " never connected within " +
                   std::to_string(connectTimeoutMs_) + " ms (" + params::kTimeoutMs.name() +
                   "); did it fail before connecting?");
      allThere = accepted && allThere;
    }
    if (!allThere) return false;
    ready_ = true;
    TOPOCCL_INFO(log::kNet, "%s connected", describe().c_str());
    return true;
  }

  bool pollDial(int index) {
    Stream& stream = streams_[static_cast<size_t>(index)];
    if (stream.connected) return true;
    if (!stream.fd) {  // waiting to retry after a refusal
      if (Clock::now() < stream.retryAt) return false;
      startDial(index);
    }
    pollfd entry{stream.fd.get(), POLLOUT, 0};
    if (::poll(&entry, 1, 0) <= 0) {
      if (Clock::now() >= connectDeadline_)
        failRemote(describe() + ": timed out connecting to " + peerName_ + " (unreachable, or a firewall drops it?)");
      return false;
    }
    const int error = bootstrap::finishConnect(stream.fd.get());
    if (error == 0) {
      stream.connected = true;
      // Send the hello now: a connection to oneself only completes once its own acceptor saw it.
      sendHello(stream);
      return true;
    }
    // The peer's listener exists before its address is published, so a refusal means it is gone
    // or unreachable; retry briefly anyway in case of transient network trouble.
    if (Clock::now() >= connectDeadline_)
      failRemote(describe() + ": cannot connect to " + peerName_ + ": " + std::strerror(error) +
                 " (is that rank still alive?)");
    stream.fd.reset();
    stream.retryAt = Clock::now() + std::chrono::milliseconds(100);
    return false;
  }

  bool collectAccepted() {
    hub_->poll();
    for (auto& arrived : hub_->take(peerRank_, channel_)) {
      const StreamHello& hello = arrived.hello;
      if (nstreams_ == 0) setStreamCount(hello.nstreams);
      Stream* slot = hello.nstreams == nstreams_ ? &streams_[static_cast<size_t>(hello.streamIndex)] : nullptr;
      FileDescriptor* target = slot == nullptr ? nullptr : (dials_ ? &slot->selfIn : &slot->fd);
      if (target == nullptr || target->valid()) {
        TOPOCCL_WARN("%s: dropped an unexpected stream %d/%d from rank %d (stale connection?)", describe().c_str(),
                     hello.streamIndex, hello.nstreams, hello.rank);
        continue;
      }
      *target = std::move(arrived.fd);
      if (!dials_) slot->connected = true;
    }
    if (nstreams_ == 0) return false;
    for (const Stream& stream : streams_)
      if (!(dials_ ? stream.selfIn.valid() : stream.fd.valid())) return false;
    return true;
  }

  // ------------------------------------------------------------------------------------------
  // Sending

  // Pushes the dialler's hello out; true once it is all on the wire (always, for accepted streams).
  bool sendHello(Stream& stream) {
    if (stream.helloSent == sizeof(stream.hello)) return true;
    const char* bytes = reinterpret_cast<const char*>(&stream.hello);
    iovec part{const_cast<char*>(bytes + stream.helloSent), sizeof(stream.hello) - stream.helloSent};
    const IoResult result = bootstrap::sendSome(stream.sendFd(), &part, 1, describe());
    if (result.peerGone) failPeerGone(result, "handshake");
    stream.helloSent += result.bytes;
    return stream.helloSent == sizeof(stream.hello);
  }

  void progressSends(int index) {
    Stream& stream = streams_[static_cast<size_t>(index)];
    if (!sendHello(stream)) return;
    for (;;) {
      if (!stream.sending && !startNextSendPart(index, stream)) return;
      iovec parts[2];
      int count = 0;
      if (stream.sendHeaderDone < sizeof(PartHeader))
        parts[count++] = {reinterpret_cast<char*>(&stream.sendHeader) + stream.sendHeaderDone,
                          sizeof(PartHeader) - stream.sendHeaderDone};
      if (stream.sendPayloadLeft > 0) parts[count++] = {const_cast<char*>(stream.sendPayload), stream.sendPayloadLeft};
      const IoResult result = bootstrap::sendSome(stream.sendFd(), parts, count, describe());
      if (result.peerGone) failPeerGone(result, "send");
      size_t moved = result.bytes;
      const size_t headerPart = std::min(moved, sizeof(PartHeader) - stream.sendHeaderDone);
      stream.sendHeaderDone += headerPart;
      moved -= headerPart;
      stream.sendPayload += moved;
      stream.sendPayloadLeft -= moved;
      if (stream.sendHeaderDone == sizeof(PartHeader) && stream.sendPayloadLeft == 0) {
        sendMessage(stream.sendCursor).partsLeft -= 1;
        stream.sending = false;
        stream.sendCursor += 1;
        continue;
      }
      if (result.bytes == 0) return;  // socket buffer full
    }
  }

  SendMessage& sendMessage(Ticket ticket) { return sends_[static_cast<size_t>(ticket - sendsCompleted_ - 1)]; }
  RecvMessage& recvMessage(Ticket ticket) { return recvs_[static_cast<size_t>(ticket - recvsCompleted_ - 1)]; }

  bool startNextSendPart(int index, Stream& stream) {
    Ticket ticket = std::max(stream.sendCursor, sendsCompleted_ + 1);
    for (; ticket < nextSendTicket_; ++ticket) {
      SendMessage& message = sendMessage(ticket);
      const int part = partOnStream(ticket, message.stripe.parts, index);
      if (part < 0) continue;
      stream.sendCursor = ticket;
      const size_t offset = socket_detail::partOffset(message.stripe, part);
      const size_t length = socket_detail::partLength(message.stripe, message.bytes, part);
      stream.sendHeader = PartHeader{kPartMagic, ticket - 1, message.bytes, offset, length};
      stream.sendHeaderDone = 0;
      stream.sendPayload = message.data + offset;
      stream.sendPayloadLeft = length;
      stream.sending = true;
      return true;
    }
    stream.sendCursor = ticket;
    return false;
  }

  // ------------------------------------------------------------------------------------------
  // Receiving

  void progressRecvs(int index) {
    Stream& stream = streams_[static_cast<size_t>(index)];
    for (;;) {
      if (!stream.receiving && !startNextRecvPart(index, stream)) return;
      RecvMessage& message = recvMessage(stream.recvCursor);
      if (stream.recvHeaderDone < sizeof(PartHeader)) {
        char* bytes = reinterpret_cast<char*>(&stream.recvHeader);
        const IoResult result = bootstrap::recvSome(stream.recvFd(), bytes + stream.recvHeaderDone,
                                                    sizeof(PartHeader) - stream.recvHeaderDone, describe());
        if (result.peerGone) failPeerGone(result, "receive");
        stream.recvHeaderDone += result.bytes;
        if (stream.recvHeaderDone < sizeof(PartHeader)) return;
        checkHeader(index, message);
      }
      if (stream.recvPayloadDone < stream.recvHeader.length && !receivePayload(stream, message)) return;
      if (stream.recvPayloadDone == stream.recvHeader.length) {
        message.partsLeft -= 1;
        stream.receiving = false;
        stream.recvCursor += 1;
      }
    }
  }

  bool startNextRecvPart(int index, Stream& stream) {
    Ticket ticket = std::max(stream.recvCursor, recvsCompleted_ + 1);
    for (; ticket < nextRecvTicket_; ++ticket) {
      RecvMessage& message = recvMessage(ticket);
      const bool firstPartHere = static_cast<int>((ticket - 1) % static_cast<Ticket>(nstreams_)) == index;
      // Until part 0 confirmed the size, this stream cannot know whether it carries a part: wait.
      if (!firstPartHere && !message.sizeConfirmed) break;
      if (partOnStream(ticket, message.stripe.parts, index) < 0) continue;
      stream.recvCursor = ticket;
      stream.receiving = true;
      stream.recvHeaderDone = 0;
      stream.recvPayloadDone = 0;
      stream.stagingFill = 0;
      stream.reducedBytes = 0;
      return true;
    }
    stream.recvCursor = ticket;
    return false;
  }

  void checkHeader(int index, RecvMessage& message) {
    const PartHeader& header = streams_[static_cast<size_t>(index)].recvHeader;
    const Ticket ticket = message.ticket;
    if (header.magic != kPartMagic || header.sequence != ticket - 1)
      failRemote(describe() + ": " + peerName_ + " sent a malformed part header on stream " + std::to_string(index) +
                 " (expected message #" + std::to_string(ticket - 1) + ")");
    if (header.totalBytes != message.bytes)
      throw Error(ncclRemoteError, describe() + ": message #" + std::to_string(ticket - 1) + " size mismatch: " +
                                        peerName_ + " sent " + std::to_string(header.totalBytes) +
                                        " bytes but this rank posted a receive of " + std::to_string(message.bytes) +
                                        " bytes");
    const int part = partOnStream(ticket, message.stripe.parts, index);
    if (header.offset != socket_detail::partOffset(message.stripe, part) ||
        header.length != socket_detail::partLength(message.stripe, message.bytes, part))
      failRemote(describe() + ": " + peerName_ + " striped message #" + std::to_string(ticket - 1) +
                 " differently from this rank (different " + params::kNSocks.name() + "?)");
    message.sizeConfirmed = true;
  }

  // Returns false when the socket has nothing more for now.
  bool receivePayload(Stream& stream, RecvMessage& message) {
    const RecvAction& action = message.action;
    char* dst = static_cast<char*>(action.dst) + stream.recvHeader.offset;
    const size_t length = stream.recvHeader.length;
    if (action.operand == nullptr) {
      // Plain receive: straight into the destination, no staging copy.
      while (stream.recvPayloadDone < length) {
        const IoResult result = bootstrap::recvSome(stream.recvFd(), dst + stream.recvPayloadDone,
                                                    length - stream.recvPayloadDone, describe());
        if (result.peerGone) failPeerGone(result, "receive");
        if (result.bytes == 0) return false;
        stream.recvPayloadDone += result.bytes;
      }
      return true;
    }
    // Reduce: land in a bounded staging buffer, reduce whole elements, keep any partial element.
    const size_t element = action.elementSize;
    const size_t capacity = std::max(element, kStagingBytes / element * element);
    if (stream.staging.size() < capacity) stream.staging.resize(capacity);
    const char* operand = static_cast<const char*>(action.operand) + stream.recvHeader.offset;
    while (stream.recvPayloadDone < length) {
      const size_t room = std::min(capacity - stream.stagingFill, length - stream.recvPayloadDone);
      const IoResult result =
          bootstrap::recvSome(stream.recvFd(), stream.staging.data() + stream.stagingFill, room, describe());
      if (result.peerGone) failPeerGone(result, "receive");
      if (result.bytes == 0) return false;
      stream.stagingFill += result.bytes;
      stream.recvPayloadDone += result.bytes;
      const size_t whole = stream.stagingFill / element * element;
      if (whole > 0) {
        action.reduce(dst + stream.reducedBytes, stream.staging.data(), operand + stream.reducedBytes, whole / element);
        stream.reducedBytes += whole;
        std::memmove(stream.staging.data(), stream.staging.data() + whole, stream.stagingFill - whole);
        stream.stagingFill -= whole;
      }
    }
    return true;
  }

  void retireCompleted() {
    while (!sends_.empty() && sends_.front().partsLeft == 0) {
      sends_.pop_front();
      ++sendsCompleted_;
    }
    while (!recvs_.empty() && recvs_.front().partsLeft == 0) {
      recvs_.pop_front();
      ++recvsCompleted_;
    }
  }

  [[noreturn]] void failPeerGone(const IoResult& result, const char* during) const {
    failRemote(peerName_ + " " + bootstrap::describePeerGone(result) + " during " + during + " on channel " +
               std::to_string(channel_));
  }

  std::shared_ptr<AcceptHub> hub_;
  const CommIdentity self_;
  const int peerRank_;
  const int channel_;
  const bool dials_;    // lower rank (or a connection to oneself)
  const bool accepts_;  // higher rank (or a connection to oneself)
  std::string peerName_;
  SocketAddress peerAddress_;
  int64_t connectTimeoutMs_ = 0;
  Deadline connectDeadline_;  // for the handshake: dialling, or waiting for the dialler
  int nstreams_ = 0;  // 0 until known (acceptor: from the first hello)
  std::vector<Stream> streams_;
  bool ready_ = false;
  std::optional<Error> failure_;

  std::deque<SendMessage> sends_;  // front is ticket sendsCompleted_ + 1
  std::deque<RecvMessage> recvs_;
  Ticket nextSendTicket_ = 1;
  Ticket nextRecvTicket_ = 1;
  Ticket sendsCompleted_ = 0;
  Ticket recvsCompleted_ = 0;
};

class SocketTransport final : public Transport {
 public:
  SocketTransport(const CommIdentity& identity, std::shared_ptr<AcceptHub> hub, std::string hostId)
      : identity_(identity), hub_(std::move(hub)), hostId_(std::move(hostId)) {}

  const char* name() const override { return "socket"; }
  // TCP reaches any host, and serves as the fallback on this one.
  bool canConnect(const PeerInfo&, const PeerInfo&) const override { return true; }

  std::unique_ptr<Connection> connect(const PeerInfo& peer, int channel) override {
    if (peer.rank < 0 || peer.rank >= identity_.nranks)
      throwInvalidArgument("socket transport rank " + std::to_string(identity_.rank) + ": connect to rank " +
                           std::to_string(peer.rank) + ", which is out of range for nranks=" +
                           std::to_string(identity_.nranks));
    if (channel < 0) throwInvalidArgument("socket transport: negative channel " + std::to_string(channel));
    if (peer.socketAddress.empty() && peer.rank >= identity_.rank)  // we dial it
      throwInvalidArgument("socket transport rank " + std::to_string(identity_.rank) + ": rank " +
                           std::to_string(peer.rank) + " published no socket address");
    const bool sameHost = !hostId_.empty() && peer.hostId == hostId_;
    return std::make_unique<SocketConnection>(hub_, identity_, peer, channel, configuredStreams(sameHost));
  }

  void progress() override { hub_->poll(); }

 private:
  const CommIdentity identity_;
  std::shared_ptr<AcceptHub> hub_;
  const std::string hostId_;
};

}  // namespace

std::unique_ptr<Transport> makeSocketTransport(const CommIdentity& identity, std::string* listenAddressOut,
                                               std::string hostId) {
  bootstrap::Listener listener = bootstrap::listenOn(bootstrap::selectInterface().address, false, true);
  const std::string address = listener.address.toString();
  TOPOCCL_INFO(log::kNet | log::kInit, "socket transport rank %d listening on %s", identity.rank, address.c_str());
  if (listenAddressOut) *listenAddressOut = address;
  auto hub = std::make_shared<AcceptHub>(identity, std::move(listener));
  return std::make_unique<SocketTransport>(identity, std::move(hub), std::move(hostId));
}

}  // namespace topoccl::transport

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

StripePlanner::StripePlanner(std::vector<uint32_t> weights) : weights_(std::move(weights)) {
  if (weights_.empty()) weights_.push_back(1);
  for (uint32_t w : weights_) {
    if (w == 0) throwInvalidArgument("socket transport: a stream weight of 0");
    if (w != weights_.front()) even_ = false;
  }
  cumulative_.assign(weights_.size() + 1, 0);
  for (size_t i = 0; i < weights_.size(); ++i) cumulative_[i + 1] = cumulative_[i] + weights_[i];
  if (!even_ && !std::is_sorted(weights_.begin(), weights_.end(), std::greater<>()))
    throwInvalidArgument("socket transport: stream weights must be in decreasing order");
}

size_t StripePlanner::evenPartBytes(size_t bytes) const {
  const size_t n = weights_.size();
  const size_t perStream = (bytes + n - 1) / n;
  return (perStream + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
}

int StripePlanner::partCount(size_t bytes) const {
  if (streams() == 1 || bytes < kMinStripeBytes) return 1;
  if (!even_) return streams();
  const size_t partBytes = evenPartBytes(bytes);
  return static_cast<int>((bytes + partBytes - 1) / partBytes);
}

int StripePlanner::firstStream(uint64_t sequence) const {
  return even_ ? static_cast<int>(sequence % static_cast<uint64_t>(streams())) : 0;
}

StripePlanner::Part StripePlanner::part(size_t bytes, uint64_t sequence, int index) const {
  const int parts = partCount(bytes);
  if (parts == 1) return {firstStream(sequence), 0, bytes};
  if (even_) {
    const size_t partBytes = evenPartBytes(bytes);
    const size_t offset = static_cast<size_t>(index) * partBytes;
    return {(firstStream(sequence) + index) % streams(), offset, std::min(partBytes, bytes - offset)};
  }
  // Weighted: part i on stream i, its share of the bytes in proportion to the stream's weight.
  const auto boundary = [&](size_t i) -> size_t {
    if (i == 0) return 0;
    if (i == weights_.size()) return bytes;
    __extension__ typedef unsigned __int128 Wide;  // bytes x summed weights can pass 2^64
    const Wide exact = static_cast<Wide>(bytes) * cumulative_[i] / cumulative_.back();
    return static_cast<size_t>(exact) / kStripeAlign * kStripeAlign;
  };
  const size_t begin = boundary(static_cast<size_t>(index));
  return {index, begin, boundary(static_cast<size_t>(index) + 1) - begin};
}

int StripePlanner::partOnStream(size_t bytes, uint64_t sequence, int stream) const {
  const int parts = partCount(bytes);
  if (parts == 1) return stream == firstStream(sequence) ? 0 : -1;
  if (!even_) return stream;
  const int part = (stream - firstStream(sequence) + streams()) % streams();
  return part < parts ? part : -1;
}

}  // namespace socket_detail

using socket_detail::StreamRoute;

namespace {

using bootstrap::Clock;
using bootstrap::Deadline;
using bootstrap::FileDescriptor;
using bootstrap::IoResult;
using bootstrap::SocketAddress;

// First bytes the dialler sends on every stream, so the acceptor knows whose stream it is.
struct StreamHello {
  uint64_t magic = 0;
  uint64_t secret = 0;
  uint64_t commHash = 0;
  int32_t rank = -1;  // the dialler
  int32_t channel = -1;
  int32_t streamIndex = -1;
  int32_t nstreams = 0;  // the dialler's stream count; the acceptor adopts it
  uint32_t weight = 1;   // this stream's share of striped messages (Mbit/s of its NIC pair, or 1)
  uint32_t direction = 0;  // StreamDirection: which end sends on it
};
// Every TCP stream carries data one way: the dialler's parts on a forward stream, the acceptor's on the
// reverse one. When both ends send at once on one shared stream, each end's sendmsg holds the socket
// while the other's data arrives, so the kernel queues it to the socket's backlog and handles it twice:
// the same 2 x 1 MiB exchange took 572 us over one stream and 294 us over a stream per direction
// (perf/RESULTS.md).
enum StreamDirection : uint32_t { kForward = 0, kReverse = 1 };
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
// Most bytes one sendmsg or recv moves; after one that leaves its part unfinished the stream turns to the
// other direction. Short turns keep both directions flowing and each socket's lock held briefly: 2-rank TCP
// all-reduce at 2-16 MiB took 1.2-1.8x longer with whole parts per call (perf/RESULTS.md).
constexpr size_t kMaxIoBytes = 256 << 10;
constexpr size_t kStagingBytes = kMaxIoBytes;  // per stream, only for receives that reduce
constexpr auto kHelloPatience = std::chrono::seconds(30);

// Streams per NIC pair; 0: automatic (see planRoutes).
int configuredStreams() {
  const int64_t wanted = params::kNSocks.get();
  if (wanted == 0) return 0;
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
    std::string nic;  // the interface of the listener it came in on ("" when unnamed)
  };

  AcceptHub(const CommIdentity& identity, std::vector<bootstrap::Listener> listeners, std::vector<std::string> nicNames)
      : identity_(identity), listeners_(std::move(listeners)), nicNames_(std::move(nicNames)) {
    name_ = "socket transport rank " + std::to_string(identity.rank) + " listener";
    for (const auto& listener : listeners_) name_ += " " + listener.address.toString();
  }

  // Accepts what is pending on every NIC and reads hellos as far as they have arrived. Never blocks.
  void poll() {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < listeners_.size(); ++i) {
      for (;;) {
        SocketAddress from;
        FileDescriptor fd = bootstrap::acceptConnection(listeners_[i].fd.get(), true, &from, name_);
        if (!fd) break;
        pending_.push_back(Pending{std::move(fd), from, {}, 0, Clock::now() + kHelloPatience,
                                   i < nicNames_.size() ? nicNames_[i] : std::string()});
      }
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
    std::string nic;
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
             hello.streamIndex >= hello.nstreams || hello.weight == 0 ||
             (hello.direction != kForward && hello.direction != kReverse))
      refusal = "malformed channel or stream numbers";
    if (refusal) {
      TOPOCCL_WARN("%s: refused a connection from %s: %s", name_.c_str(), from.c_str(), refusal);
      return true;
    }
    TOPOCCL_TRACE(log::kNet, "%s: stream %d/%d from rank %d channel %d arrived", name_.c_str(), hello.streamIndex,
                  hello.nstreams, hello.rank, hello.channel);
    parked_[{hello.rank, hello.channel}].push_back(Arrived{std::move(pending.fd), hello, pending.nic});
    return true;
  }

  const CommIdentity identity_;
  std::vector<bootstrap::Listener> listeners_;
  std::vector<std::string> nicNames_;  // per listener
  std::string name_;
  std::mutex mutex_;
  std::vector<Pending> pending_;
  std::map<std::pair<int, int>, std::vector<Arrived>> parked_;
};

class SocketConnection final : public Connection {
 public:
  SocketConnection(std::shared_ptr<AcceptHub> hub, const CommIdentity& self, const PeerInfo& peer, int channel,
                   std::vector<StreamRoute> routes)
      : hub_(std::move(hub)),
        self_(self),
        peerRank_(peer.rank),
        channel_(channel),
        dials_(self.rank <= peer.rank),
        accepts_(self.rank >= peer.rank) {
    peerName_ = "socket peer rank " + std::to_string(peer.rank) + " (" + peer.socketAddress + ")";
    refreshDescription();
    connectTimeoutMs_ = params::kTimeoutMs.get();
    connectDeadline_ = Clock::now() + std::chrono::milliseconds(connectTimeoutMs_);
    if (dials_) {
      routes_ = std::move(routes);
      setStreamCount(static_cast<int>(routes_.size()));
      // To oneself the forward streams are all there is: this end accepts what it sends.
      const std::vector<StreamDirection> directions =
          accepts_ ? std::vector{kForward} : std::vector{kForward, kReverse};
      for (int index = 0; index < nstreams_; ++index) {
        streams_[static_cast<size_t>(index)].weight = routes_[static_cast<size_t>(index)].weight;
        streams_[static_cast<size_t>(index)].label = routes_[static_cast<size_t>(index)].label;
        for (StreamDirection direction : directions) {
          dialling_.push_back(Dial{});
          dialling_.back().index = index;
          dialling_.back().direction = direction;
          startDial(dialling_.back());
        }
      }
    }
  }

  Ticket postSend(const void* data, size_t bytes) override {
    SendMessage message;
    message.ticket = nextSendTicket_++;
    message.data = static_cast<const char*>(data);
    message.bytes = bytes;
    if (ready_) plan(message);
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
    if (ready_) plan(message);
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
      for (Stream& stream : streams_)
        for (FileDescriptor* fd : {&stream.out, &stream.in})
          if (fd->valid()) ::shutdown(fd->get(), SHUT_RDWR);
      for (Dial& dial : dialling_)
        if (dial.fd.valid()) ::shutdown(dial.fd.get(), SHUT_RDWR);
      throw;
    }
  }

  Ticket sendsCompleted() const override { return sendsCompleted_; }
  Ticket recvsCompleted() const override { return recvsCompleted_; }
  int peer() const override { return peerRank_; }
  const char* transportName() const override { return "socket"; }
  // Per stream: what it still owes. A NIC that went down shows as its streams stuck mid-part while the
  // others are idle.
  std::string describeStall() const override {
    if (!ready_) return "handshake not finished";
    std::string out;
    for (size_t i = 0; i < streams_.size(); ++i) {
      const Stream& stream = streams_[i];
      const std::string name = "stream " + std::to_string(i) + (stream.label.size() > 2 ? " " + stream.label : "");
      if (stream.receiving)
        out += (out.empty() ? "" : ", ") + name + " receiving message #" + std::to_string(stream.recvCursor - 1) + " (" +
               std::to_string(stream.recvHeader.length > stream.recvPayloadDone && stream.recvHeaderDone == sizeof(PartHeader)
                                  ? stream.recvHeader.length - stream.recvPayloadDone
                                  : 0) +
               " bytes to go)";
      if (stream.sending)
        out += (out.empty() ? "" : ", ") + name + " sending message #" + std::to_string(stream.sendCursor - 1) + " (" +
               std::to_string(stream.sendPayloadLeft) + " bytes to go)";
    }
    return out.empty() ? "every stream idle" : "stuck: " + out;
  }

  bool addPollDescriptors(std::vector<pollfd>& fds) const override {
    if (!ready_ || failure_) return false;
    for (const Stream& stream : streams_) {
      // Always readable interest: data, or the peer closing, is what a waiting engine must see.
      fds.push_back({stream.recvFd(), POLLIN, 0});
      if (!sends_.empty()) fds.push_back({stream.sendFd(), POLLOUT, 0});
    }
    return true;
  }
  std::string describe() const override { return description_; }

 private:
  struct SendMessage {
    Ticket ticket = 0;
    const char* data = nullptr;
    size_t bytes = 0;
    int partsLeft = -1;  // -1 until the connection is ready and knows its streams
  };
  struct RecvMessage {
    Ticket ticket = 0;
    RecvAction action;
    size_t bytes = 0;
    int partsLeft = -1;
    bool sizeConfirmed = false;  // part 0's header matched the posted size
  };
  // One stream of the connection: a TCP stream out (this end's parts) and one in (the peer's), dialled or
  // accepted according to StreamDirection.
  struct Stream {
    FileDescriptor out;
    FileDescriptor in;
    uint32_t weight = 1;     // from the route (dialler) or the hello (acceptor)
    std::string label;       // for reports: "eth0->eth0" (dialler), "->eth0" (acceptor)
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

    int sendFd() const { return out.get(); }
    int recvFd() const { return in.get(); }
  };
  // A TCP stream the dialler is still opening; handed to its Stream once its hello is out.
  struct Dial {
    int index = 0;
    StreamDirection direction = kForward;
    FileDescriptor fd;
    bool connected = false;
    bool handedOver = false;
    Deadline retryAt{};
    StreamHello hello;
    size_t helloSent = 0;
  };

  void setStreamCount(int count) {
    nstreams_ = count;
    streams_.resize(static_cast<size_t>(count));
    refreshDescription();
  }

  // Built when what it names changes, not per call: every send and receive passes it for its errors.
  void refreshDescription() {
    description_ = "socket to rank " + std::to_string(peerRank_) + peerName_.substr(peerName_.find(" (")) +
                   " channel " + std::to_string(channel_) +
                   (nstreams_ > 0 ? ", " + std::to_string(nstreams_) + " streams" : "") + layout_;
  }

  void plan(SendMessage& message) const { message.partsLeft = planner_.partCount(message.bytes); }
  void plan(RecvMessage& message) const { message.partsLeft = planner_.partCount(message.bytes); }

  // Which part of message `ticket` stream `index` carries, or -1.
  int partOnStream(Ticket ticket, size_t bytes, int index) const { return planner_.partOnStream(bytes, ticket - 1, index); }

  [[noreturn]] void failRemote(const std::string& message) const { throw Error(ncclRemoteError, message); }

  // ------------------------------------------------------------------------------------------
  // Setup: dialling (lower rank) or collecting accepted streams (higher rank).

  void startDial(Dial& dial) {
    const StreamRoute& route = routes_[static_cast<size_t>(dial.index)];
    dial.fd = bootstrap::startConnect(route.remote, describe(), &route.local);
    dial.connected = false;
    dial.hello = StreamHello{kStreamHelloMagic, self_.secret, self_.commHash, self_.rank, channel_, dial.index,
                             nstreams_, route.weight, dial.direction};
    dial.helloSent = 0;
  }

  bool finishSetup() {
    bool allThere = true;
    if (dials_) {
      for (Dial& dial : dialling_) allThere = pollDial(dial) && allThere;
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
    dialling_.clear();
    std::vector<uint32_t> weights;
    for (const Stream& stream : streams_) weights.push_back(stream.weight);
    planner_ = socket_detail::StripePlanner(std::move(weights));
    if (!routes_.empty() && !std::equal(routes_.begin() + 1, routes_.end(), routes_.begin(),
                                         [](const StreamRoute& a, const StreamRoute& b) { return a.label == b.label; })) {
      layout_ = " (";
      for (size_t i = 0; i < routes_.size(); ++i)
        layout_ += (i ? ", " : "") + routes_[i].label + " w" + std::to_string(routes_[i].weight);
      layout_ += ")";
    }
    refreshDescription();
    for (auto& message : sends_) plan(message);
    for (auto& message : recvs_) plan(message);
    ready_ = true;
    TOPOCCL_INFO(log::kNet, "%s connected", describe().c_str());
    return true;
  }

  // True once the stream is connected, its hello is out and it sits in its Stream.
  bool pollDial(Dial& dial) {
    if (dial.handedOver) return true;
    if (dial.connected) return sendHello(dial);
    if (!dial.fd) {  // waiting to retry after a refusal
      if (Clock::now() < dial.retryAt) return false;
      startDial(dial);
    }
    pollfd entry{dial.fd.get(), POLLOUT, 0};
    if (::poll(&entry, 1, 0) <= 0) {
      if (Clock::now() >= connectDeadline_)
        failRemote(describe() + ": timed out connecting to " + peerName_ + " (unreachable, or a firewall drops it?)");
      return false;
    }
    const int error = bootstrap::finishConnect(dial.fd.get());
    if (error == 0) {
      dial.connected = true;
      // Send the hello now: a connection to oneself only completes once its own acceptor saw it.
      return sendHello(dial);
    }
    // The peer's listener exists before its address is published, so a refusal means it is gone
    // or unreachable; retry briefly anyway in case of transient network trouble.
    if (Clock::now() >= connectDeadline_)
      failRemote(describe() + ": cannot connect to " + peerName_ + ": " + std::strerror(error) +
                 " (is that rank still alive?)");
    dial.fd.reset();
    dial.retryAt = Clock::now() + std::chrono::milliseconds(100);
    return false;
  }

  bool collectAccepted() {
    hub_->poll();
    for (auto& arrived : hub_->take(peerRank_, channel_)) {
      const StreamHello& hello = arrived.hello;
      if (nstreams_ == 0) setStreamCount(hello.nstreams);
      Stream* slot = hello.nstreams == nstreams_ ? &streams_[static_cast<size_t>(hello.streamIndex)] : nullptr;
      // The dialler's forward stream brings its parts in; on the reverse one this end sends.
      FileDescriptor* target = slot == nullptr || (dials_ && hello.direction == kReverse) ? nullptr
                               : hello.direction == kForward                             ? &slot->in
                                                                                         : &slot->out;
      if (target == nullptr || target->valid()) {
        TOPOCCL_WARN("%s: dropped an unexpected stream %d/%d from rank %d (stale connection?)", describe().c_str(),
                     hello.streamIndex, hello.nstreams, hello.rank);
        continue;
      }
      *target = std::move(arrived.fd);
      if (!dials_) {
        slot->weight = hello.weight;
        slot->label = "->" + arrived.nic;  // the dialler's NIC is its business; ours is where it arrived
      }
    }
    if (nstreams_ == 0) return false;
    for (const Stream& stream : streams_)
      if (!stream.in.valid() || (!dials_ && !stream.out.valid())) return false;
    return true;
  }

  // ------------------------------------------------------------------------------------------
  // Sending

  // Pushes a dialled stream's hello out; once it is all on the wire the stream joins its Stream.
  bool sendHello(Dial& dial) {
    const char* bytes = reinterpret_cast<const char*>(&dial.hello);
    iovec part{const_cast<char*>(bytes + dial.helloSent), sizeof(dial.hello) - dial.helloSent};
    const IoResult result = bootstrap::sendSome(dial.fd.get(), &part, 1, description_);
    if (result.peerGone) failPeerGone(result, "handshake");
    dial.helloSent += result.bytes;
    if (dial.helloSent < sizeof(dial.hello)) return false;
    Stream& stream = streams_[static_cast<size_t>(dial.index)];
    (dial.direction == kForward ? stream.out : stream.in) = std::move(dial.fd);
    dial.handedOver = true;
    return true;
  }

  void progressSends(int index) {
    Stream& stream = streams_[static_cast<size_t>(index)];
    for (;;) {
      if (!stream.sending && !startNextSendPart(index, stream)) return;
      iovec parts[2];
      int count = 0;
      if (stream.sendHeaderDone < sizeof(PartHeader))
        parts[count++] = {reinterpret_cast<char*>(&stream.sendHeader) + stream.sendHeaderDone,
                          sizeof(PartHeader) - stream.sendHeaderDone};
      if (stream.sendPayloadLeft > 0) parts[count++] = {const_cast<char*>(stream.sendPayload), std::min(kMaxIoBytes, stream.sendPayloadLeft)};
      const IoResult result = bootstrap::sendSome(stream.sendFd(), parts, count, description_);
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
      return;  // socket buffer full, or this direction's turn is over
    }
  }

  SendMessage& sendMessage(Ticket ticket) { return sends_[static_cast<size_t>(ticket - sendsCompleted_ - 1)]; }
  RecvMessage& recvMessage(Ticket ticket) { return recvs_[static_cast<size_t>(ticket - recvsCompleted_ - 1)]; }

  bool startNextSendPart(int index, Stream& stream) {
    Ticket ticket = std::max(stream.sendCursor, sendsCompleted_ + 1);
    for (; ticket < nextSendTicket_; ++ticket) {
      SendMessage& message = sendMessage(ticket);
      const int part = partOnStream(ticket, message.bytes, index);
      if (part < 0) continue;
      stream.sendCursor = ticket;
      const auto range = planner_.part(message.bytes, ticket - 1, part);
      stream.sendHeader = PartHeader{kPartMagic, ticket - 1, message.bytes, range.offset, range.length};
      stream.sendHeaderDone = 0;
      stream.sendPayload = message.data + range.offset;
      stream.sendPayloadLeft = range.length;
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
                                                    sizeof(PartHeader) - stream.recvHeaderDone, description_);
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
      const bool firstPartHere = planner_.firstStream(ticket - 1) == index;
      // Until part 0 confirmed the size, this stream cannot know whether it carries a part: wait.
      if (!firstPartHere && !message.sizeConfirmed) break;
      if (partOnStream(ticket, message.bytes, index) < 0) continue;
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
    const auto range = planner_.part(message.bytes, ticket - 1, partOnStream(ticket, message.bytes, index));
    if (header.offset != range.offset || header.length != range.length)
      failRemote(describe() + ": " + peerName_ + " striped message #" + std::to_string(ticket - 1) +
                 " differently from this rank (different " + params::kNSocks.name() + "?)");
    message.sizeConfirmed = true;
  }

  // Returns false when the socket has nothing more for now, or after one call that left the part unfinished.
  bool receivePayload(Stream& stream, RecvMessage& message) {
    const RecvAction& action = message.action;
    char* dst = static_cast<char*>(action.dst) + stream.recvHeader.offset;
    const size_t length = stream.recvHeader.length;
    if (action.operand == nullptr) {
      // Plain receive: straight into the destination, no staging copy.
      while (stream.recvPayloadDone < length) {
        const IoResult result = bootstrap::recvSome(stream.recvFd(), dst + stream.recvPayloadDone,
                                                    std::min(kMaxIoBytes, length - stream.recvPayloadDone), description_);
        if (result.peerGone) failPeerGone(result, "receive");
        if (result.bytes == 0) return false;
        stream.recvPayloadDone += result.bytes;
        if (stream.recvPayloadDone < length) return false;  // the send direction's turn
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
          bootstrap::recvSome(stream.recvFd(), stream.staging.data() + stream.stagingFill, room, description_);
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
      if (stream.recvPayloadDone < length) return false;  // the send direction's turn
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
  std::vector<StreamRoute> routes_;  // dialler only
  std::string layout_;               // for describe(): which NICs the streams use, when more than one
  std::string description_;          // what describe() returns; see refreshDescription()
  socket_detail::StripePlanner planner_;
  int64_t connectTimeoutMs_ = 0;
  Deadline connectDeadline_;  // for the handshake: dialling, or waiting for the dialler
  int nstreams_ = 0;  // 0 until known (acceptor: from the first hello)
  std::vector<Stream> streams_;
  std::vector<Dial> dialling_;  // dialler, until the handshake is done
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
  SocketTransport(const CommIdentity& identity, std::shared_ptr<AcceptHub> hub, std::string hostId,
                  std::vector<NicEndpoint> nics)
      : identity_(identity), hub_(std::move(hub)), hostId_(std::move(hostId)), nics_(std::move(nics)) {}

  const char* name() const override { return "socket"; }
  // TCP reaches any host, and serves as the fallback on this one.
  bool canConnect(const PeerInfo&, const PeerInfo&) const override { return true; }

  std::unique_ptr<Connection> connect(const PeerInfo& peer, int channel) override {
    if (peer.rank < 0 || peer.rank >= identity_.nranks)
      throwInvalidArgument("socket transport rank " + std::to_string(identity_.rank) + ": connect to rank " +
                           std::to_string(peer.rank) + ", which is out of range for nranks=" +
                           std::to_string(identity_.nranks));
    if (channel < 0) throwInvalidArgument("socket transport: negative channel " + std::to_string(channel));
    const bool dials = identity_.rank <= peer.rank;
    if (dials && peer.socketAddress.empty() && peer.nics.empty())
      throwInvalidArgument("socket transport rank " + std::to_string(identity_.rank) + ": rank " +
                           std::to_string(peer.rank) + " published no socket address");
    const bool sameHost = !hostId_.empty() && peer.hostId == hostId_;
    std::vector<StreamRoute> routes;
    if (dials) routes = socket_detail::planRoutes(nics_, peerNics(peer), sameHost, configuredStreams(),
                                                  nicPolicy());
    return std::make_unique<SocketConnection>(hub_, identity_, peer, channel, std::move(routes));
  }

  void progress() override { hub_->poll(); }
  void setSelf(const PeerInfo& self) override {
    if (self.nics.size() == nics_.size())
      for (size_t i = 0; i < nics_.size(); ++i) nics_[i].near = self.nics[i].near;
  }

 private:
  static std::vector<NicEndpoint> peerNics(const PeerInfo& peer) {
    if (!peer.nics.empty()) return peer.nics;
    return {NicEndpoint{"", peer.socketAddress, 0, 0, true}};
  }
  static bool nicPolicy() {
    const std::string policy = params::kNetNics.get();
    if (policy == "all") return false;
    if (policy == "near") return true;
    throwInvalidArgument(std::string(params::kNetNics.name()) + "='" + policy + "' is not 'all' or 'near'");
  }

  const CommIdentity identity_;
  std::shared_ptr<AcceptHub> hub_;
  const std::string hostId_;
  std::vector<NicEndpoint> nics_;
};

}  // namespace

namespace socket_detail {

std::vector<StreamRoute> planRoutes(const std::vector<NicEndpoint>& mine, const std::vector<NicEndpoint>& theirs,
                                    bool sameHost, int streamsPerPair, bool nearOnly) {
  struct Pair {
    const NicEndpoint* local;
    const NicEndpoint* remote;
  };
  std::vector<Pair> pairs;
  // On one host the NICs do not matter (loopback); between hosts NIC k pairs with the peer's NIC on its rail.
  if (!sameHost) {
    for (const NicEndpoint& local : mine) {
      if (nearOnly && !local.near) continue;
      for (const NicEndpoint& remote : theirs)
        if (remote.rail == local.rail) {
          pairs.push_back({&local, &remote});
          break;
        }
    }
  }
  if (pairs.empty()) pairs.push_back({&mine.front(), &theirs.front()});
  // Automatic: loopback TCP is bound by the CPU that runs both ends' stacks, and one stream per same-host
  // peer measured faster than two (perf/RESULTS.md); one NIC pair gets two streams, several pairs one each
  // (2 x 2 streams over a 2 + 0.5 Gbit/s pair of NICs took 5% longer than 2 x 1 on the emulated cluster).
  if (streamsPerPair == 0) streamsPerPair = sameHost ? 1 : std::max<int>(1, 2 / static_cast<int>(pairs.size()));
  bool speedsKnown = true;
  for (const Pair& pair : pairs) speedsKnown = speedsKnown && pair.local->gbps > 0 && pair.remote->gbps > 0;
  std::vector<StreamRoute> routes;
  for (const Pair& pair : pairs) {
    StreamRoute route;
    route.local = SocketAddress::parse(pair.local->address);
    route.local.setPort(0);
    route.remote = SocketAddress::parse(pair.remote->address);
    route.label = (pair.local->name.empty() ? route.local.host() : pair.local->name) + "->" +
                  (pair.remote->name.empty() ? route.remote.host() : pair.remote->name);
    // Mbit/s of the pair's slower end, shared by its streams.
    const double mbits = std::min(pair.local->gbps, pair.remote->gbps) * 1000.0 / streamsPerPair;
    route.weight = speedsKnown ? static_cast<uint32_t>(std::clamp(mbits, 1.0, 4.0e9)) : 1;
    for (int k = 0; k < streamsPerPair; ++k) routes.push_back(route);
  }
  // Heaviest first: the planner puts small messages and part 0 on stream 0.
  std::stable_sort(routes.begin(), routes.end(), [](const StreamRoute& a, const StreamRoute& b) { return a.weight > b.weight; });
  return routes;
}

}  // namespace socket_detail

std::unique_ptr<Transport> makeSocketTransport(const CommIdentity& identity, std::vector<LocalNic> nics,
                                               std::vector<NicEndpoint>* listenOut, std::string hostId) {
  if (nics.empty()) {
    const auto chosen = bootstrap::selectInterface();
    nics.push_back(LocalNic{chosen.name, chosen.address, 0, 0, true});
  }
  std::vector<bootstrap::Listener> listeners;
  std::vector<NicEndpoint> endpoints;
  for (const LocalNic& nic : nics) {
    listeners.push_back(bootstrap::listenOn(nic.address, false, true));
    endpoints.push_back(NicEndpoint{nic.name, listeners.back().address.toString(), nic.gbps, nic.rail, nic.near});
    TOPOCCL_INFO(log::kNet | log::kInit, "socket transport rank %d listening on %s (%s%s)", identity.rank,
                 endpoints.back().address.c_str(), nic.name.c_str(),
                 nic.gbps > 0 ? (", " + std::to_string(nic.gbps) + " Gbit/s, rail " + std::to_string(nic.rail)).c_str() : "");
  }
  if (listenOut) *listenOut = endpoints;
  std::vector<std::string> names;
  for (const NicEndpoint& endpoint : endpoints) names.push_back(endpoint.name);
  auto hub = std::make_shared<AcceptHub>(identity, std::move(listeners), std::move(names));
  return std::make_unique<SocketTransport>(identity, std::move(hub), std::move(hostId), std::move(endpoints));
}

std::unique_ptr<Transport> makeSocketTransport(const CommIdentity& identity, std::string* listenAddressOut,
                                               std::string hostId) {
  std::vector<NicEndpoint> endpoints;
  auto transport = makeSocketTransport(identity, {}, &endpoints, std::move(hostId));
  if (listenAddressOut) *listenAddressOut = endpoints.front().address;
  return transport;
}

}  // namespace topoccl::transport

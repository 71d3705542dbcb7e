#include "transport/local/local_transport.hpp"

#include <algorithm>
#include <atomic>
#include <compare>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "common/ring_queue.hpp"
#include "transport/doorbell.hpp"

namespace topoccl::transport {
namespace {

struct DirectionKey {
  uint64_t commHash = 0;
  int sender = -1;
  int receiver = -1;
  int channel = -1;
  auto operator<=>(const DirectionKey&) const = default;
};

struct PostedSend {
  const void* data = nullptr;
  size_t bytes = 0;
  void* mirror = nullptr;  // postSendMirrored: the receiver copies the bytes here too
  bool resultMirror = false;  // postSendResultMirrored: the receiver copies its result there instead
};

constexpr size_t kMirrorBlock = 32 << 10;  // mirrored receives read each block once into L1, then write it twice

// One direction of one connection. The sender appends buffer descriptors; the receiver applies
// its actions straight from them in order and counts them as consumed, which is what completes
// the sender's tickets (the sender's memory is in use until then).
struct Direction {
  std::mutex mutex;
  std::deque<PostedSend> posted;  // guarded by mutex; pushed by the sender, popped by the receiver
  std::string failure;            // guarded by mutex; set once with `failed`
  std::atomic<Ticket> consumed{0};
  std::atomic<bool> failed{false};
  std::atomic<bool> senderClosed{false};
  std::atomic<bool> receiverClosed{false};
  Doorbell toReceiver;  // rung by the sender when it posts or closes
  Doorbell toSender;    // rung by the receiver when it consumes, fails or closes
  // Guarded by the registry mutex.
  bool senderAttached = false;
  bool receiverAttached = false;
};

// Pairs the two ends of every direction. An entry lives until both of its ends are gone.
class Registry {
 public:
  std::shared_ptr<Direction> attach(const DirectionKey& key, bool asSender) {
    std::lock_guard lock(mutex_);
    auto& slot = directions_[key];
    if (!slot) slot = std::make_shared<Direction>();
    bool& attached = asSender ? slot->senderAttached : slot->receiverAttached;
    if (attached) {
      throwInvalidUsage("local transport: rank " + std::to_string(asSender ? key.sender : key.receiver) +
                        " connected twice to rank " + std::to_string(asSender ? key.receiver : key.sender) +
                        " on channel " + std::to_string(key.channel));
    }
    attached = true;
    return slot;
  }

  void detach(const DirectionKey& key, const std::shared_ptr<Direction>& direction, bool asSender) {
    std::lock_guard lock(mutex_);
    (asSender ? direction->senderClosed : direction->receiverClosed).store(true, std::memory_order_release);
    ring(asSender ? direction->toReceiver : direction->toSender);
    const bool otherEndDone = asSender ? (!direction->receiverAttached || direction->receiverClosed.load())
                                       : (!direction->senderAttached || direction->senderClosed.load());
    auto it = directions_.find(key);
    if (otherEndDone && it != directions_.end() && it->second == direction) directions_.erase(it);
  }

 private:
  std::mutex mutex_;
  std::map<DirectionKey, std::shared_ptr<Direction>> directions_;
};

Registry& registry() {
  // Never destroyed: connections held by static objects may outlive normal static teardown.
  static Registry* instance = new Registry;
  return *instance;
}

void validateRecvAction(const RecvAction& action, size_t bytes, const std::string& who) {
  if (bytes > 0 && action.dst == nullptr) throwInvalidArgument(who + ": receive of " + std::to_string(bytes) + " bytes into a null buffer");
  if (action.operand != nullptr) {
    if (action.reduce == nullptr) throwInvalidArgument(who + ": receive with an operand but no reduce function");
    if (action.elementSize == 0 || bytes % action.elementSize != 0) {
      throwInvalidArgument(who + ": receive of " + std::to_string(bytes) + " bytes is not a whole number of " +
                           std::to_string(action.elementSize) + "-byte elements");
    }
  }
}

void applyRecvAction(const RecvAction& action, const void* incoming, size_t bytes, size_t offset = 0) {
  if (bytes == 0) return;
  auto* dst = static_cast<unsigned char*>(action.dst) + offset;
  if (action.operand == nullptr) {
    if (action.copy) action.copy(dst, incoming, bytes);
    else std::memcpy(dst, incoming, bytes);
  } else {
    action.reduce(dst, incoming, static_cast<const unsigned char*>(action.operand) + offset, bytes / action.elementSize);
  }
}

// A mirrored send's bytes also go to `mirror`, a block at a time, while the block is still in L1.
void applyMirrored(const RecvAction& action, const void* incoming, void* mirror, size_t bytes) {
  const size_t block = action.operand == nullptr ? kMirrorBlock : kMirrorBlock / action.elementSize * action.elementSize;
  for (size_t at = 0; at < bytes; at += block) {
    const size_t n = std::min(block, bytes - at);
    const auto* from = static_cast<const unsigned char*>(incoming) + at;
    applyRecvAction(action, from, n, at);
    if (action.copy) action.copy(static_cast<unsigned char*>(mirror) + at, from, n);
    else std::memcpy(static_cast<unsigned char*>(mirror) + at, from, n);
  }
}

// A result-mirrored send: each block's result (the receive's destination, after any reduction) goes to `mirror` while
// it is in L1. In place `mirror` is `incoming` itself, whose block has been read by then.
void applyResultMirrored(const RecvAction& action, const void* incoming, void* mirror, size_t bytes) {
  const size_t block = action.operand == nullptr ? kMirrorBlock : kMirrorBlock / action.elementSize * action.elementSize;
  for (size_t at = 0; at < bytes; at += block) {
    const size_t n = std::min(block, bytes - at);
    applyRecvAction(action, static_cast<const unsigned char*>(incoming) + at, n, at);
    const auto* result = static_cast<const unsigned char*>(action.dst) + at;
    if (action.copy) action.copy(static_cast<unsigned char*>(mirror) + at, result, n);
    else std::memcpy(static_cast<unsigned char*>(mirror) + at, result, n);
  }
  *action.resultMirrored = 1;
}

class LocalConnection final : public Connection {
 public:
  LocalConnection(const CommIdentity& identity, int peerRank, int channel)
      : peer_(peerRank),
        channel_(channel),
        outKey_{identity.commHash, identity.rank, peerRank, channel},
        inKey_{identity.commHash, peerRank, identity.rank, channel} {
    out_ = registry().attach(outKey_, /*asSender=*/true);
    try {
      in_ = registry().attach(inKey_, /*asSender=*/false);
    } catch (...) {
      registry().detach(outKey_, out_, true);
      throw;
    }
  }

  ~LocalConnection() override {
    registry().detach(outKey_, out_, /*asSender=*/true);
    registry().detach(inKey_, in_, /*asSender=*/false);
  }

  Ticket postSend(const void* data, size_t bytes) override {
    if (bytes > 0 && data == nullptr) throwInvalidArgument(describe() + ": send of " + std::to_string(bytes) + " bytes from a null buffer");
    {
      std::lock_guard lock(out_->mutex);
      out_->posted.push_back({data, bytes, nullptr});
    }
    ring(out_->toReceiver);
    return ++sendsPosted_;
  }

  // One address space: any two disjoint buffers. The receiver reads ours anyway.
  bool canMirror(const void* data, const void* mirror, size_t bytes, size_t minSliceBytes) const override {
    (void)minSliceBytes;
    const auto* d = static_cast<const unsigned char*>(data);
    const auto* m = static_cast<const unsigned char*>(mirror);
    return bytes > 0 && data != nullptr && mirror != nullptr && (d + bytes <= m || m + bytes <= d);
  }

  Ticket postSendMirrored(const void* data, void* mirror, size_t bytes) override {
    if (!canMirror(data, mirror, bytes, bytes)) {
      throwInvalidArgument(describe() + ": mirrored send of " + std::to_string(bytes) + " bytes needs two disjoint buffers");
    }
    {
      std::lock_guard lock(out_->mutex);
      out_->posted.push_back({data, bytes, mirror});
    }
    ring(out_->toReceiver);
    return ++sendsPosted_;
  }

  // One address space: always, for `mirror` equal to `data` or apart from it.
  bool postSendResultMirrored(const void* data, void* mirror, size_t bytes, Ticket& ticket) override {
    const auto* d = static_cast<const unsigned char*>(data);
    const auto* m = static_cast<const unsigned char*>(mirror);
    if (bytes == 0 || data == nullptr || mirror == nullptr || (d != m && d < m + bytes && m < d + bytes)) return false;
    {
      std::lock_guard lock(out_->mutex);
      out_->posted.push_back({data, bytes, mirror, true});
    }
    ring(out_->toReceiver);
    ticket = ++sendsPosted_;
    return true;
  }

  Ticket postRecv(const RecvAction& action, size_t bytes) override {
    validateRecvAction(action, bytes, describe());
    recvs_.push_back({action, bytes});
    return ++recvsPosted_;
  }

  void progress() override {
    if (out_->failed.load(std::memory_order_acquire)) {
      std::lock_guard lock(out_->mutex);
      throwRemoteError("local peer rank " + std::to_string(peer_) + " failed on channel " + std::to_string(channel_) +
                       ": " + out_->failure);
    }
    drainIncoming();
    if (!recvs_.empty() && in_->senderClosed.load(std::memory_order_acquire)) {
      std::lock_guard lock(in_->mutex);
      if (in_->posted.empty()) {
        throwRemoteError("local peer rank " + std::to_string(peer_) + " closed the connection during receive on channel " +
                         std::to_string(channel_));
      }
    }
    // Closed first, then the count: the receiver counts everything it consumed before closing.
    if (out_->receiverClosed.load(std::memory_order_acquire) && sendsCompleted() < sendsPosted_) {
      throwRemoteError("local peer rank " + std::to_string(peer_) + " closed the connection during send on channel " +
                       std::to_string(channel_));
    }
  }

  Ticket sendsCompleted() const override { return out_->consumed.load(std::memory_order_acquire); }
  bool armDoorbells(std::vector<ArmedDoorbell>& armed) override {
    if (!recvs_.empty()) arm(in_->toReceiver, armed);
    if (sendsCompleted() < sendsPosted_) arm(out_->toSender, armed);
    return true;
  }
  Ticket recvsCompleted() const override { return recvsCompleted_; }
  int peer() const override { return peer_; }
  const char* transportName() const override { return "local"; }
  std::string describe() const override {
    return "local to rank " + std::to_string(peer_) + " channel " + std::to_string(channel_);
  }

 private:
  struct PendingRecv {
    RecvAction action;
    size_t bytes = 0;
  };

  void drainIncoming() {
    while (!recvs_.empty()) {
      PostedSend send;
      {
        std::lock_guard lock(in_->mutex);
        if (in_->posted.empty()) return;
        send = in_->posted.front();  // only this thread pops, so the front stays put
      }
      const PendingRecv& recv = recvs_.front();
      if (send.bytes != recv.bytes || (send.resultMirror && recv.action.resultMirrored == nullptr)) {
        const std::string what = send.bytes != recv.bytes
                                     ? "receive of " + std::to_string(recv.bytes) + " bytes matched a send of " +
                                           std::to_string(send.bytes) + " bytes"
                                     : "receive of " + std::to_string(recv.bytes) +
                                           " bytes returns no result, but its send asked for one (do both ranks run the same plan?)";
        {
          std::lock_guard lock(in_->mutex);
          in_->failure = what + " (rank " + std::to_string(inKey_.receiver) + ")";
        }
        in_->failed.store(true, std::memory_order_release);
        ring(in_->toSender);
        throwRemoteError("local peer rank " + std::to_string(peer_) + " on channel " + std::to_string(channel_) + ": " + what);
      }
      // The sender's buffer is valid until `consumed` moves past it, so read it outside the lock.
      if (send.resultMirror) applyResultMirrored(recv.action, send.data, send.mirror, send.bytes);
      else if (send.mirror != nullptr) applyMirrored(recv.action, send.data, send.mirror, send.bytes);
      else applyRecvAction(recv.action, send.data, send.bytes);
      {
        std::lock_guard lock(in_->mutex);
        in_->posted.pop_front();
      }
      in_->consumed.fetch_add(1, std::memory_order_release);
      ring(in_->toSender);
      recvs_.pop_front();
      ++recvsCompleted_;
    }
  }

  int peer_;
  int channel_;
  DirectionKey outKey_;
  DirectionKey inKey_;
  std::shared_ptr<Direction> out_;
  std::shared_ptr<Direction> in_;
  Ticket sendsPosted_ = 0;
  Ticket recvsPosted_ = 0;
  Ticket recvsCompleted_ = 0;
  RingQueue<PendingRecv> recvs_;
};

class LocalTransport final : public Transport {
 public:
  explicit LocalTransport(const CommIdentity& identity) : identity_(identity) {}

  const char* name() const override { return "local"; }

  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    return !params::kP2pDisable.get() && self.processToken == peer.processToken;
  }

  std::unique_ptr<Connection> connect(const PeerInfo& peer, int channel) override {
    if (peer.rank < 0 || (identity_.nranks > 0 && peer.rank >= identity_.nranks)) {
      throwInvalidArgument("local transport: peer rank " + std::to_string(peer.rank) + " is outside the communicator of " +
                           std::to_string(identity_.nranks) + " ranks");
    }
    if (channel < 0) throwInvalidArgument("local transport: channel " + std::to_string(channel) + " is negative");
    TOPOCCL_TRACE(log::kP2p, "local: rank %d connecting to rank %d channel %d", identity_.rank, peer.rank, channel);
    return std::make_unique<LocalConnection>(identity_, peer.rank, channel);
  }

 private:
  CommIdentity identity_;
};

}  // namespace

std::unique_ptr<Transport> makeLocalTransport(const CommIdentity& identity) {
  return std::make_unique<LocalTransport>(identity);
}

}  // namespace topoccl::transport

// The one narrow, non-blocking transport interface (Gloo's device/pair idea). A Transport makes
// Connections to peers; a Connection is one ordered, bidirectional message stream to one peer on
// one channel. Nothing here knows about plans, collectives or CUDA.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/doorbell.hpp"

namespace topoccl::transport {

// What a completed receive does with the incoming bytes. Copy: dst = incoming. Reduce:
// dst = incoming (+) operand, elementwise with `reduce` over bytes / elementSize elements.
// Applying the action inside the transport lets shm and local peers reduce straight out of the
// sender's memory or the FIFO, with no staging copy.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
struct RecvAction {
  void* dst = nullptr;
  const void* operand = nullptr;  // null: plain copy
  ReduceFn reduce = nullptr;      // required when operand is set
  size_t elementSize = 1;
  // How a plain copy moves the bytes; null: memcpy. (The executor passes kernels::streamingCopy when the
  // operation's buffers exceed the caches; transports stay below kernels.)
  CopyFn copy = nullptr;
  // Set to 1 when the message came from postSendResultMirrored and this receive wrote its result into the sender's
  // mirror too. Null: this receive expects none, and a message that asks for one is a protocol error.
  uint8_t* resultMirrored = nullptr;
};

// One NIC a rank listens on (socket transport).
struct NicEndpoint {
  std::string name;     // interface, "eth0"; may be empty
  std::string address;  // "ip:port" of the listener on it
  double gbps = 0;      // 0: unknown
  int rail = 0;
  bool near = true;     // nearest its rank (cluster file)
};

// Everything a rank tells the others at bootstrap that transports need to reach it.
struct PeerInfo {
  int rank = -1;
  std::string hostId;            // same string <=> same host (boot id, or NCCL_HOSTID)
  int64_t pid = 0;
  uint64_t processToken = 0;     // same value <=> same process (random per process)
  std::string socketAddress;     // "ip:port" of the rank's data listener (socket transport): nics[0]
  std::vector<NicEndpoint> nics; // every NIC it listens on; empty: socketAddress only
};

// Identity of the communicator, so transports of different communicators never cross.
struct CommIdentity {
  uint64_t commHash = 0;  // from the unique id; equal on all ranks of a communicator
  uint64_t secret = 0;    // presented on every TCP connection; strangers are refused
  int rank = -1;
  int nranks = 0;
};

// Tickets are numbered from 1 per connection and direction; operations complete in order. An operation may
// complete inside its post call (shm does so for small messages with nothing queued before them), so whatever a
// receive reads (its operand) must be ready when it is posted.
using Ticket = uint64_t;

class Connection {
 public:
  virtual ~Connection() = default;
  // Queue a send of `bytes` from `data`; the memory must stay valid and unchanged until
  // sendsCompleted() >= the returned ticket.
  virtual Ticket postSend(const void* data, size_t bytes) = 0;
  // Mirrored sends: the bytes also go to `mirror`, memory of ours, while they are in cache from reading them out
  // of `data` (by the receiver, where it reads our memory; else by us, right after copying them out), so a block
  // that a rank both sends and copies to its own output (an out-of-place all-gather's or broadcast's own block) is
  // read from memory once instead of twice. canMirror says whether every
  // send of a slice of [data, data + bytes) to [mirror, mirror + bytes), no slice shorter than minSliceBytes,
  // may be posted that way; then postSendMirrored is postSend, and once the send completes `mirror` holds the
  // bytes. `mirror` must not overlap `data`, and nothing may read or write it until then.
  virtual bool canMirror(const void* data, const void* mirror, size_t bytes, size_t minSliceBytes) const {
    (void)data, (void)mirror, (void)bytes, (void)minSliceBytes;
    return false;
  }
  virtual Ticket postSendMirrored(const void* data, void* mirror, size_t bytes);
  // Result mirrors: the receiver writes what its receive makes of these bytes (dst, after any reduction) to `mirror`,
  // memory of ours, as it goes, so that the result it would send back is here when the send completes (a 2-rank
  // reduce-scatter then all-gather: each rank sums half and writes both copies). `mirror` is `data` itself (in
  // place) or apart from it, and nothing may read or write it until then. Returns false, posting nothing, where the
  // receiver cannot write our memory; the caller then posts the send as usual. The receive must pass
  // RecvAction::resultMirrored.
  virtual bool postSendResultMirrored(const void* data, void* mirror, size_t bytes, Ticket& ticket) {
    (void)data, (void)mirror, (void)bytes, (void)ticket;
    return false;
  }
  // postSend for bytes the caller will overwrite within the same operation (a receive of its own lands there: an
  // in-place swap or recursive doubling). A connection whose peer would otherwise read `data` in place copies it
  // out instead, so the send completes without waiting for that read and the caller's receive can land at once.
  // Same contract as postSend; by default it is postSend.
  virtual Ticket postSendCopyOut(const void* data, size_t bytes) { return postSend(data, bytes); }
  // A send whose completion the caller will not wait on idly: it has receives of the same operation to do
  // meanwhile. A connection whose peer may read our memory lets it from a smaller size than its default (shm:
  // kZeroCopyBytesOwnCores where ranks share cores), since the wait for that read overlaps the caller's own work.
  // Same contract as postSend; by default it is postSend.
  virtual Ticket postSendReadEarly(const void* data, size_t bytes) { return postSend(data, bytes); }
  // How this side copies when it moves bytes of its sends into the peer's memory itself (an shm sender that helps
  // its receiver with a large message), set by the executor before it posts, as RecvAction::copy. Null: memcpy.
  void setPeerCopy(CopyFn copy) { peerCopy_ = copy; }
  // Called by an engine whose last pass moved nothing: work this side can take over from its peer meanwhile (an shm
  // sender copying part of its own large message into the receiver's buffer). Returns whether it did any.
  virtual bool helpPeer() { return false; }
  // Queue a receive of exactly `bytes`; completion means the action has been applied.
  virtual Ticket postRecv(const RecvAction& action, size_t bytes) = 0;
  // Move data; never blocks. Throws topoccl::Error (ncclRemoteError / ncclSystemError) naming the
  // transport, the peer and what failed, e.g. a peer that closed or sent a wrong-sized message.
  virtual void progress() = 0;
  virtual Ticket sendsCompleted() const = 0;
  virtual Ticket recvsCompleted() const = 0;
  virtual int peer() const = 0;
  virtual const char* transportName() const = 0;  // "local", "shm", "socket"
  virtual std::string describe() const = 0;        // "shm to rank 3 (pid 1234) channel 0"
  // Where data is stuck, for stall reports (e.g. which NIC's stream still waits for bytes); "" when nothing
  // more specific than describe() is known.
  virtual std::string describeStall() const { return {}; }
  // Appends the descriptors whose readiness lets progress() move data (poll(2) events), so an idle
  // engine can sleep in poll() instead of spinning. False when this connection cannot be waited on that
  // way (shared memory flags, or a handshake still under way): the engine then spins or yields.
  virtual bool addPollDescriptors(std::vector<pollfd>& fds) const {
    (void)fds;
    return false;
  }
  // Arms the doorbells (doorbell.hpp) that the peer rings when it moves something this side waits for, so
  // an idle engine can sleep in the kernel instead of spinning. False when this connection cannot be waited
  // on that way (sockets, or a handshake still under way); what it armed before saying so stays in `armed`.
  virtual bool armDoorbells(std::vector<ArmedDoorbell>& armed) {
    (void)armed;
    return false;
  }

 protected:
  CopyFn peerCopy_ = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // Whether this transport can reach `peer` from `self` at all.
  virtual bool canConnect(const PeerInfo& self, const PeerInfo& peer) const = 0;
  // Start connecting; returns at once. The connection finishes its handshake inside progress(),
  // so two ranks may connect to each other in any order without deadlock. Both sides of the
  // pair call connect(peer, channel).
  virtual std::unique_ptr<Connection> connect(const PeerInfo& peer, int channel) = 0;
  // Background duties (accepting incoming TCP connections, ...). Never blocks.
  virtual void progress() {}
  // This rank as every rank sees it after the exchange (e.g. which of its NICs are nearest it); called
  // before the first connect().
  virtual void setSelf(const PeerInfo& self) { (void)self; }
};

}  // namespace topoccl::transport

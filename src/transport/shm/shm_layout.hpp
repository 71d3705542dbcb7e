// The layout of a shm segment: what the receiver creates in /dev/shm and the sender attaches to. Both sides of
// the transport (shm_transport.cpp) and the tests that forge a peer (tests/transport/test_shm_transport.cpp) use
// it; kLayoutVersion changes with it, and a segment of another version is refused at attach.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/doorbell.hpp"

namespace topoccl::transport::shm_layout {

constexpr uint64_t kSegmentMagic = 0x746f706f73686d31ull;  // "toposhm1"
constexpr uint32_t kLayoutVersion = 10;  // 7: small messages span several slots; 8: receiverPidNamespace; 9: copy offers;
                                         // 10: result mirrors
constexpr size_t kAlign = 64;                               // cache line; slot payloads are multiples of it

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shm FIFO counters must be lock-free to live in shared memory");

enum SegmentState : uint32_t { kCreating = 0, kReady = 1, kAttached = 2, kEstablished = 3 };
enum SlotKind : uint32_t { kInlineFragment = 1, kCmaDescriptor = 2, kTinyMessage = 3, kSharedBuffer = 4, kSharedMirror = 5 };
// kSharedBuffer's `shared.flags`: the next slot (kSharedMirror, published first) names a shared allocation of the
// sender's that the receiver also copies the message into (Connection::postSendMirrored).
constexpr uint32_t kMirrorFollows = 1;
// With kMirrorFollows: the mirror gets the receive's result (its destination after any reduction), not the bytes
// sent (Connection::postSendResultMirrored).
constexpr uint32_t kResultMirror = 2;
constexpr size_t kTinyBytes = 32;  // messages this small travel inside their descriptor's cache line
// Up to this many more bytes travel in the descriptor slots that follow (kContinuationBytes each): consecutive lines
// the receiver reads right after the first, instead of a line of the payload ring it has to look up first.
constexpr size_t kContinuationBytes = kAlign - sizeof(uint64_t);  // each keeps its own `sequence`
// More lines than this cost the sender more than the receiver saves (perf/RESULTS.md, session 26).
constexpr size_t kMaxContinuationSlots = 9;
constexpr size_t kSlotMessageBytes = kTinyBytes + kMaxContinuationSlots * kContinuationBytes;  // 536
constexpr size_t kMaxSlotBytes = size_t{1} << 30;  // fragment sizes fit the descriptor's 32 bits

// What the sender says about the slot it publishes: one cache line, which the receiver polls.
// `sequence` is written last (release), so a small message costs one line handoff, not a flag's
// line plus a data line.
struct alignas(kAlign) SlotDescriptor {
  std::atomic<uint64_t> sequence;  // the slot's counter + 1 once published
  uint64_t messageBytes;
  uint64_t offset;         // of this fragment within the message
  uint32_t fragmentBytes;  // payload bytes in this slot (inline fragment or tiny message)
  uint32_t kind;
  union {
    uint64_t cmaAddress;     // the sender's buffer, for process_vm_readv
    uint64_t payloadOffset;  // an inline fragment's bytes in the payload ring
    unsigned char tiny[kTinyBytes];
    struct {  // the sender's buffer lies in one of its shared allocations (ncclMemAlloc)
      int32_t fd;
      uint32_t flags;
      uint64_t inode;
      uint64_t allocationBytes;
      uint64_t offset;
    } shared;
  };
};
static_assert(sizeof(SlotDescriptor) == kAlign, "a slot descriptor is one cache line");

// A kTinyMessage of more than kTinyBytes goes on in the slots after its descriptor: each keeps `sequence` (so a
// receiver polling it on a later lap never takes message bytes for a publication) and carries kContinuationBytes.
inline unsigned char* continuationBytes(SlotDescriptor& slot) { return reinterpret_cast<unsigned char*>(&slot) + sizeof(uint64_t); }
inline const unsigned char* continuationBytes(const SlotDescriptor& slot) {
  return reinterpret_cast<const unsigned char*>(&slot) + sizeof(uint64_t);
}
inline size_t continuationSlotsFor(size_t bytes) {
  return bytes <= kTinyBytes ? 0 : (bytes - kTinyBytes + kContinuationBytes - 1) / kContinuationBytes;
}

// A receiver's offer to share the copy of the kSharedBuffer message at its tail with the sender, which would
// otherwise wait idle for it: where the bytes go, in a shared allocation of the receiver's. Both sides then claim
// blocks of it (SegmentHeader::copyClaims) and each copies its own, the sender through its own mapping of that
// allocation (and into its mirror, for a mirrored send). Written by the receiver, `sequence` last.
struct alignas(kAlign) CopyOffer {
  std::atomic<uint64_t> sequence;  // the message's first slot's sequence (its counter + 1); 0 = none yet
  int32_t fd;                      // the receiver's memfd, as SlotDescriptor::shared names the sender's
  uint32_t flags;                  // none defined; 0
  uint64_t inode;
  uint64_t allocationBytes;
  uint64_t offset;                 // of the destination within that allocation
  uint64_t messageBytes;
  uint64_t blockBytes;             // the claimed unit; the last block may be shorter
};
static_assert(sizeof(CopyOffer) == kAlign, "a copy offer is one cache line");

// copyClaims: the offer's sequence in the high 32 bits (a claim made against an older offer fails), the next
// unclaimed block in the low 32.
inline uint64_t copyClaimsTag(uint64_t sequence) { return (sequence & 0xffffffffull) << 32; }

struct SegmentHeader {
  // Written by the receiver before kReady, read-only afterwards.
  uint64_t magic;
  uint32_t version;
  uint32_t descriptorCount;
  uint64_t payloadBytes;   // the payload ring
  uint64_t fragmentBytes;  // the largest inline fragment
  uint64_t totalBytes;
  uint64_t commHash;
  int64_t receiverPid;
  int64_t senderPid;  // the pid the receiver expects to attach
  uint64_t receiverPidNamespace;  // its pid namespace's inode: pids name the same process only within one
  int32_t senderRank;
  int32_t receiverRank;
  int32_t channel;
  std::atomic<uint32_t> state;
  uint64_t senderProbeAddress;  // written by the sender before kAttached
  int64_t senderShareProbeFd;   // likewise: a shared allocation of the sender's to prove we can map it; -1 = none
  uint64_t senderShareProbeInode;
  uint64_t cmaThreshold;        // written by the receiver before kEstablished; 0 = no CMA
  uint64_t zeroCopyThreshold;   // likewise; 0 = the receiver cannot map the sender's shared allocations
  // One writer each, on separate cache lines so the two sides do not false-share.
  // Slots released by the receiver (publication is each descriptor's `sequence`); on its own line.
  alignas(kAlign) std::atomic<uint64_t> tail;
  alignas(kAlign) std::atomic<uint32_t> senderClosed;
  std::atomic<uint32_t> receiverClosed;
  std::atomic<uint32_t> receiverFailed;
  char failureText[200];  // written before receiverFailed
  // Rung by the sender when it publishes slots (and closes), by the receiver when it releases them.
  Doorbell receiverBell;
  Doorbell senderBell;
  // The copy the receiver shares with the sender (CopyOffer). The receiver resets the counters, then publishes
  // the offer; it completes the message once every block is claimed and copyBlocksBySender covers the sender's.
  CopyOffer copyOffer;
  alignas(kAlign) std::atomic<uint64_t> copyClaims;
  alignas(kAlign) std::atomic<uint64_t> copyBlocksBySender;  // blocks of the current offer the sender has copied
};

inline size_t alignUp(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

struct SegmentGeometry {
  size_t descriptorsOffset;
  size_t payloadOffset;
  size_t totalBytes;
};

inline SegmentGeometry geometryFor(size_t descriptorCount, size_t payloadBytes) {
  SegmentGeometry g{};
  g.descriptorsOffset = alignUp(sizeof(SegmentHeader), kAlign);
  g.payloadOffset = alignUp(g.descriptorsOffset + descriptorCount * sizeof(SlotDescriptor), 4096);  // on a page of its own
  g.totalBytes = g.payloadOffset + payloadBytes;
  return g;
}

}  // namespace topoccl::transport::shm_layout

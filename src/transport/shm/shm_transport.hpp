// The shm transport: ranks that are processes of one host. Each direction of a connection is a
// FIFO of slots in a POSIX shared-memory segment that the receiver creates. Large messages from
// buffers of ncclMemAlloc (shared allocations) move with one copy: the receiver maps the sender's
// allocation and copies out of it. Optionally (TOPOCCL_SHM_CMA) cross-memory attach does the same
// for any buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace topoccl::transport {

// Where TOPOCCL_SHM_ZERO_COPY_THRESHOLD is not set, messages from shared allocations go zero copy from this size.
// Zero copy ends a send only once the peer has read it: a sender whose peer shares its core then waits for the
// scheduler (4-rank broadcast at 8-16 KiB 2.5-3x slower from 8 KiB than from 32), while on cores of their own 2
// ranks' collectives at 8-32 KiB ran up to 4x faster from 8 KiB (perf/RESULTS.md, session 44). A send whose rank
// has receives to do meanwhile may ask for the smaller size anyway (postSendReadEarly; session 45).
inline constexpr size_t kZeroCopyBytesSharingCores = 32 << 10;
inline constexpr size_t kZeroCopyBytesOwnCores = 8 << 10;

// One per rank. canConnect: same hostId, different processToken (and NCCL_SHM_DISABLE unset).
std::unique_ptr<Transport> makeShmTransport(const CommIdentity& identity, const PeerInfo& self,
                                            size_t zeroCopyThreshold = kZeroCopyBytesSharingCores);

// FIFO geometry a receiver creates now, from TOPOCCL_SHM_SLOTS, NCCL_BUFFSIZE and TOPOCCL_SHM_FRAGMENTS.
// The sender adopts whatever the receiver created, so the two sides never have to agree on settings.
struct ShmFifoLayout {
  size_t descriptorCount = 0;  // messages (or fragments) in flight, one cache line each
  size_t payloadBytes = 0;     // the ring that larger messages are copied through, a multiple of 64
  size_t fragmentBytes = 0;    // the largest piece of a message in the ring, a multiple of 64, <= payloadBytes / 2
};
ShmFifoLayout shmFifoLayout();

// Removes the /dev/shm names of segments whose receiver has exited (killed, or left with _exit, before its
// peer attached: only then does the name outlive it). Only this user's segments of this layout whose receiver
// ran in our pid namespace are judged. Returns the names removed. makeShmTransport runs it once per process.
std::vector<std::string> removeShmSegmentsOfExitedRanks();

// Name of the segment carrying sender -> receiver on `channel` (for diagnostics and tests).
std::string shmSegmentName(uint64_t commHash, int sender, int receiver, int channel);

// What a shm connection has done so far; for tests and debugging. Throws invalid usage when
// `connection` is not a shm connection.
struct ShmConnectionStats {
  bool established = false;      // both directions finished their handshake
  bool cmaReceive = false;       // large incoming messages are read with process_vm_readv
  bool cmaSend = false;          // the peer reads our large messages with process_vm_readv
  uint64_t fifoMessagesReceived = 0;
  uint64_t slotMessagesReceived = 0;  // of those, small ones that spanned several descriptor slots
  uint64_t cmaMessagesReceived = 0;
  bool zeroCopyReceive = false;  // we map the peer's shared allocations (ncclMemAlloc) and copy out of them
  bool zeroCopySend = false;     // the peer maps ours
  uint64_t zeroCopyMessagesReceived = 0;
  uint64_t mirroredMessagesReceived = 0;  // of those, how many we also copied into the sender's mirror
  uint64_t resultMirrorsWritten = 0;      // of those, how many got our receive's result (postSendResultMirrored)
  uint64_t senderMirroredMessages = 0;    // mirrored sends of ours whose mirror we wrote (the peer could not map it)
  uint64_t sharedCopyOffers = 0;          // zero-copy receives whose copy we offered to share with the sender
  uint64_t blocksCopiedBySender = 0;      // blocks of those the sender copied into our buffers
  uint64_t blocksCopiedForReceiver = 0;   // blocks of our sends we copied into the receiver's buffers
};
ShmConnectionStats shmConnectionStats(const Connection& connection);

}  // namespace topoccl::transport

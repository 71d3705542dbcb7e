#include "transport/shm/shm_transport.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "common/ring_queue.hpp"
#include "transport/doorbell.hpp"
#include "transport/shm/shared_allocation.hpp"
#include "transport/shm/shm_layout.hpp"

namespace topoccl::transport {
namespace {

using namespace shm_layout;
using Clock = std::chrono::steady_clock;

constexpr size_t kMirrorBlock = 32 << 10;  // receivers of mirrored sends read each block once into L1, then write it twice
// Result-mirrored sends go zero copy from this size (messages up to kSlotMessageBytes ride the descriptor slots).
constexpr uint64_t kResultMirrorMinBytes = 1024;

constexpr auto kLivenessInterval = std::chrono::milliseconds(100);
constexpr uint64_t kPollsPerClockRead = 64;
constexpr size_t kCmaStagingBytes = 256 << 10;              // piece size when reducing CMA data
constexpr size_t kCmaBytesPerProgress = 8 << 20;            // bounds the work of one progress() call
constexpr size_t kZeroCopyPiece = 1 << 20;                  // zero-copy receives copy this much at a time
// A copy shared by both ends (CopyOffer) is claimed this much at a time: small enough that the two finish close
// together, large enough that the claims' one contended line costs little against the copy.
constexpr size_t kSharedCopyBlock = 64 << 10;
constexpr size_t kSharedCopyBytesPerProgress = 1 << 20;     // a helping sender returns to its executor this often

// The receiver reads this through process_vm_readv during the handshake: one cheap read proves
// that the kernel lets this pair use CMA (Yama, seccomp and containers often forbid it).
constexpr uint64_t kCmaProbeValue = 0x636d612d70726f62ull;
const uint64_t cmaProbe = kCmaProbeValue;
std::atomic<bool> cmaUnsupportedByKernel{false};  // ENOSYS is process-wide; EPERM is per peer

// One page of shared memory per process, holding kShareProbeValue: a receiver that can open and map
// it through /proc/<pid>/fd can map the sender's ncclMemAlloc buffers too.
constexpr uint64_t kShareProbeValue = 0x7a65726f636f7079ull;  // "zerocopy"
std::optional<SharedRange> shareProbe() {
  static const std::optional<SharedRange> probe = []() -> std::optional<SharedRange> {
    try {
      void* page = allocateShared(4096);
      *static_cast<uint64_t*>(page) = kShareProbeValue;
      return findShared(page, sizeof(uint64_t));
    } catch (const Error&) {
      return std::nullopt;  // no memfd here: zero copy stays off
    }
  }();
  return probe;
}

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

class SharedMapping {
 public:
  SharedMapping() = default;
  SharedMapping(void* address, size_t bytes) : address_(address), bytes_(bytes) {}
  SharedMapping(SharedMapping&& other) noexcept : address_(other.address_), bytes_(other.bytes_) {
    other.address_ = nullptr;
    other.bytes_ = 0;
  }
  SharedMapping& operator=(SharedMapping&& other) noexcept {
    if (this != &other) {
      reset();
      std::swap(address_, other.address_);
      std::swap(bytes_, other.bytes_);
    }
    return *this;
  }
  ~SharedMapping() { reset(); }
  void reset() {
    if (address_ != nullptr) ::munmap(address_, bytes_);
    address_ = nullptr;
    bytes_ = 0;
  }
  unsigned char* bytes() const { return static_cast<unsigned char*>(address_); }
  size_t size() const { return bytes_; }
  explicit operator bool() const { return address_ != nullptr; }

 private:
  void* address_ = nullptr;
  size_t bytes_ = 0;
};

// Maps the whole of `fd`; nullopt-free: throws on failure.
SharedMapping mapShared(int fd, size_t bytes, const std::string& what) {
  // Populated now: the FIFO's first lap would otherwise fault on every page (~8 ms for 4 MiB here).
  void* address = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (address == MAP_FAILED) throwSystemError("shm transport: mapping " + std::to_string(bytes) + " bytes of " + what);
  return SharedMapping(address, bytes);
}

// Touches every page of [begin, begin + bytes): written (with zeros) when this side owns the bytes, read
// otherwise. MAP_POPULATE fills this process's page tables, but under a shadow-paging hypervisor (PVM, as
// on this project's CI machines) each page's first access from each process still traps to the host,
// 30-50 us a page, which would otherwise land in the timed first lap of the FIFO.
void touchPages(unsigned char* begin, size_t bytes, bool write) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  volatile unsigned char* bytesVolatile = begin;
  unsigned char sink = 0;
  for (size_t at = 0; at < bytes; at += page) {
    if (write) bytesVolatile[at] = 0;
    else sink = static_cast<unsigned char>(sink + bytesVolatile[at]);
  }
  static_cast<void>(sink);
}

// This process's pid namespace (the inode of /proc/self/ns/pid); 0 when it cannot be read.
uint64_t pidNamespace() {
  static const uint64_t inode = [] {
    struct stat st {};
    return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : uint64_t{0};
  }();
  return inode;
}

// A name in /dev/shm that this object is responsible for removing.
class SegmentName {
 public:
  SegmentName() = default;
  SegmentName(const SegmentName&) = delete;
  SegmentName& operator=(const SegmentName&) = delete;
  ~SegmentName() { unlink(); }
  void adopt(std::string name) {
    unlink();
    name_ = std::move(name);
    linked_ = true;
  }
  void unlink() {
    if (linked_) ::shm_unlink(name_.c_str());  // ENOENT is fine: the peer may have done it
    linked_ = false;
  }

 private:
  std::string name_;
  bool linked_ = false;
};

// A mapped segment seen through its layout.
struct SegmentView {
  SharedMapping mapping;
  SegmentHeader* header = nullptr;
  SlotDescriptor* descriptors = nullptr;
  unsigned char* payload = nullptr;
  size_t descriptorCount = 0;
  size_t descriptorMask = 0;  // descriptorCount - 1 when a power of two (the default): a mask, not a division, per slot
  size_t payloadBytes = 0;
  size_t fragmentBytes = 0;

  void bind(SharedMapping mapped, const ShmFifoLayout& layout) {
    mapping = std::move(mapped);
    const SegmentGeometry g = geometryFor(layout.descriptorCount, layout.payloadBytes);
    header = std::launder(reinterpret_cast<SegmentHeader*>(mapping.bytes()));
    descriptors = reinterpret_cast<SlotDescriptor*>(mapping.bytes() + g.descriptorsOffset);
    payload = mapping.bytes() + g.payloadOffset;
    descriptorCount = layout.descriptorCount;
    descriptorMask = std::has_single_bit(descriptorCount) ? descriptorCount - 1 : 0;
    payloadBytes = layout.payloadBytes;
    fragmentBytes = layout.fragmentBytes;
  }
  size_t slotIndex(uint64_t counter) const {
    return descriptorMask != 0 ? static_cast<size_t>(counter) & descriptorMask : static_cast<size_t>(counter % descriptorCount);
  }
  SlotDescriptor& slotDescriptor(uint64_t counter) const { return descriptors[slotIndex(counter)]; }
  // The slot after `index`, in ring order.
  size_t nextIndex(size_t index) const { return index + 1 == descriptorCount ? 0 : index + 1; }
};

// kill(pid, 0) alone is not enough: a SIGKILLed child that its parent has not reaped yet is a
// zombie and still answers. /proc tells zombies apart; when /proc is unreadable, trust kill().
bool processAlive(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%" PRId64 "/stat", pid);
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return true;
  char text[512];
  const ssize_t n = ::read(fd.get(), text, sizeof(text) - 1);
  if (n <= 0) return true;
  text[n] = '\0';
  const char* close = std::strrchr(text, ')');  // the command name may itself contain ')'
  if (close == nullptr || close[1] != ' ') return true;
  const char state = close[2];
  return state != 'Z' && state != 'X';
}

struct PendingSend {
  const unsigned char* data = nullptr;
  size_t bytes = 0;
  unsigned char* mirror = nullptr;  // postSendMirrored: the bytes go here too (written by the receiver, or by us)
  size_t offset = 0;              // bytes already copied into slots (inline)
  bool published = false;         // every slot of it is in the FIFO
  uint64_t releasedAtTail = 0;    // CMA: complete once the receiver's tail reaches this; 0 = at publish
  CopyFn copy = nullptr;          // how we copy blocks of it for the receiver (Connection::setPeerCopy)
  uint64_t offerSequence = 0;     // zero copy: the sequence a CopyOffer for it names (its first slot's); 0 = none
  bool receiverWritesMirror = false;  // a mirrored send published as such: whoever copies a block writes its mirror
  bool copyOut = false;               // postSendCopyOut: through the FIFO, never read in place (zero copy or CMA)
  bool readEarly = false;             // postSendReadEarly: zero copy from readEarlyBytes_ already
  bool resultMirror = false;          // postSendResultMirrored: published zero copy, the receiver writes its result
};

struct PendingRecv {
  RecvAction action;
  size_t bytes = 0;
  size_t offset = 0;  // bytes applied so far
  // A zero-copy message whose copy we offered to share (CopyOffer): blocks we claimed and copied, and whether
  // the claims ran out (then we only wait for the sender's last ones).
  bool offered = false;
  bool claimsExhausted = false;
  uint64_t ownBlocks = 0;
};

class ShmConnection final : public Connection {
 public:
  ShmConnection(const CommIdentity& identity, const PeerInfo& self, const PeerInfo& peer, int channel, size_t zeroCopyThreshold)
      : commHash_(identity.commHash),
        selfRank_(identity.rank),
        selfPid_(self.pid > 0 ? self.pid : static_cast<int64_t>(::getpid())),
        peerRank_(peer.rank),
        peerPid_(peer.pid),
        channel_(channel),
        outName_(shmSegmentName(identity.commHash, identity.rank, peer.rank, channel)) {
    const int64_t timeoutMs = params::kTimeoutMs.get();
    if (timeoutMs > 0) connectDeadline_ = Clock::now() + std::chrono::milliseconds(timeoutMs);
    cmaThreshold_ = !params::kShmCma.get() ? 0 : static_cast<uint64_t>(std::max<int64_t>(1, params::kShmCmaThreshold.get()));
    const int64_t zeroCopyFrom = params::kShmZeroCopyThreshold.get();
    zeroCopyThreshold_ = !params::kShmZeroCopy.get() ? 0
                         : zeroCopyFrom > 0       ? static_cast<uint64_t>(zeroCopyFrom)
                                                  : std::max<uint64_t>(1, zeroCopyThreshold);
    if (zeroCopyFrom > 0) readEarlyBytes_ = UINT64_MAX;  // the setting holds for every send
    sharedCopyBytes_ = static_cast<uint64_t>(std::max<int64_t>(0, params::kShmSharedCopyBytes.get()));
    createIncomingSegment();
  }

  ~ShmConnection() override {
    // Tell a peer that is still waiting on us, so it fails fast instead of waiting for our pid.
    if (in_.header != nullptr) {
      publishTail();
      in_.header->receiverClosed.store(1, std::memory_order_release);
      ring(in_.header->senderBell);
    }
    if (out_.header != nullptr && outAttached_) {
      out_.header->senderClosed.store(1, std::memory_order_release);
      ring(out_.header->receiverBell);
    }
  }

  Ticket postSend(const void* data, size_t bytes) override {
    if (bytes > 0 && data == nullptr) throwInvalidArgument(describe() + ": send of " + std::to_string(bytes) + " bytes from a null buffer");
    // A message that fits in slots, with nothing queued before it, is published here and now. It would complete at
    // publish anyway; skipping the queue and progress() is most of the transport's cost of a small collective.
    if (static_cast<int64_t>(bytes) <= directSendMaxBytes_ && directSendAllowed(continuationSlotsFor(bytes))) {
      publishDirect(static_cast<const unsigned char*>(data), bytes);
      ++sendsCompleted_;
      return ++sendsPosted_;
    }
    sends_.push_back({static_cast<const unsigned char*>(data), bytes, nullptr, 0, false, 0, peerCopy_});
    return ++sendsPosted_;
  }

  // The bytes go through the FIFO even from a shared allocation: copied into the ring by our next progress(), the
  // send completes then, not when the peer has read our buffer.
  Ticket postSendCopyOut(const void* data, size_t bytes) override {
    const Ticket ticket = postSend(data, bytes);
    if (sendsCompleted_ < ticket) sends_[sends_.size() - 1].copyOut = true;
    return ticket;
  }

  // Zero copy from readEarlyBytes_ instead of the size the receiver offered, where that is larger.
  Ticket postSendReadEarly(const void* data, size_t bytes) override {
    const Ticket ticket = postSend(data, bytes);
    if (sendsCompleted_ < ticket) sends_[sends_.size() - 1].readEarly = true;
    return ticket;
  }

  // Any two disjoint buffers. Who writes the mirror is decided per message at publish: the receiver where both
  // are shared allocations and the message goes zero copy (it maps both, read-write since the handshake's probe);
  // otherwise this side, right after publishing each slot, from its cache where it just copied the bytes out.
  bool canMirror(const void* data, const void* mirror, size_t bytes, size_t minSliceBytes) const override {
    (void)minSliceBytes;
    if (bytes == 0 || data == nullptr || mirror == nullptr) return false;
    const auto* d = static_cast<const unsigned char*>(data);
    const auto* m = static_cast<const unsigned char*>(mirror);
    return !(d < m + bytes && m < d + bytes);
  }

  Ticket postSendMirrored(const void* data, void* mirror, size_t bytes) override {
    if (bytes == 0 || data == nullptr || mirror == nullptr) {
      throwInvalidArgument(describe() + ": mirrored send of " + std::to_string(bytes) + " bytes needs both buffers");
    }
    if (static_cast<int64_t>(bytes) <= directSendMaxBytes_ && directSendAllowed(continuationSlotsFor(bytes))) {  // as postSend, then our copy
      publishDirect(static_cast<const unsigned char*>(data), bytes);
      std::memcpy(mirror, data, bytes);
      ++senderMirroredMessages_;
      ++sendsCompleted_;
      return ++sendsPosted_;
    }
    sends_.push_back({static_cast<const unsigned char*>(data), bytes, static_cast<unsigned char*>(mirror), 0, false, 0, peerCopy_});
    return ++sendsPosted_;
  }

  // Zero copy, both buffers shared allocations: decided here, so the caller knows at once whether the receiver will
  // write the result (it skips its receive of it then). Where ranks have cores of their own, from kResultMirrorMinBytes,
  // below the zero-copy size: that size keeps a sender from waiting on a reader, but here the sender waits for the
  // result either way, and the peer sends nothing back (2-rank all-reduce at 4-16 KiB: 0.45-0.85x recursive
  // doubling's time, session 50).
  bool postSendResultMirrored(const void* data, void* mirror, size_t bytes, Ticket& ticket) override {
    if (bytes == 0 || data == nullptr || mirror == nullptr || !outEstablished_ || outZeroCopyThreshold_ == 0 ||
        out_.descriptorCount < 2) {
      return false;
    }
    // TOPOCCL_SHM_ZERO_COPY_THRESHOLD, where set, holds for these too, and so does the larger size of ranks that share
    // cores, where the wait is for a peer the scheduler may not run (4 ranks on 2 CPUs at 64 KiB: 1.5x the time).
    const bool zeroCopySize = readEarlyBytes_ == UINT64_MAX || outZeroCopyThreshold_ > kZeroCopyBytesOwnCores;
    if (bytes < (zeroCopySize ? outZeroCopyThreshold_ : std::min<uint64_t>(kResultMirrorMinBytes, outZeroCopyThreshold_))) return false;
    const auto* d = static_cast<const unsigned char*>(data);
    const auto* m = static_cast<const unsigned char*>(mirror);
    if (d != m && d < m + bytes && m < d + bytes) return false;  // overlapping, shifted
    if (!findShared(data, bytes) || !findShared(mirror, bytes)) return false;
    PendingSend send{d, bytes, static_cast<unsigned char*>(mirror), 0, false, 0, peerCopy_};
    send.resultMirror = true;
    sends_.push_back(send);
    ticket = ++sendsPosted_;
    return true;
  }

  Ticket postRecv(const RecvAction& action, size_t bytes) override {
    if (bytes > 0 && action.dst == nullptr) throwInvalidArgument(describe() + ": receive of " + std::to_string(bytes) + " bytes into a null buffer");
    if (action.operand != nullptr) {
      if (action.reduce == nullptr) throwInvalidArgument(describe() + ": receive with an operand but no reduce function");
      // Fragments start at multiples of kAlign, so an element must never straddle two slots.
      if (action.elementSize == 0 || kAlign % action.elementSize != 0 || bytes % action.elementSize != 0) {
        throwInvalidArgument(describe() + ": reduce of " + std::to_string(bytes) + " bytes with " +
                             std::to_string(action.elementSize) + "-byte elements (element size must divide 64 and the size)");
      }
    }
    // Likewise a message in slots that is already here, when no receive is queued before this one.
    if (bytes <= kSlotMessageBytes && recvs_.empty() && inEstablished_ && !failure_ && incomingSlotReady()) {
      const SlotDescriptor& slot = in_.slotDescriptor(inTail_);
      const size_t continuations = continuationSlotsFor(bytes);
      if (slot.kind == kTinyMessage && slot.messageBytes == bytes && slot.fragmentBytes == bytes && slot.offset == 0 &&
          continuations < in_.descriptorCount) {
        const uint64_t tailBefore = inTailPublished_;
        try {
          takeSlotMessage(PendingRecv{action, bytes, 0}, slot, continuations);
        } catch (const Error& e) {
          failure_ = e;  // as progress() would: every later call repeats it
          throw;
        }
        if (inTailPublished_ != tailBefore) ring(in_.header->senderBell);
        ++recvsCompleted_;
        return ++recvsPosted_;
      }  // anything else, a malformed slot included, is the queue's to handle and report
    }
    recvs_.push_back({action, bytes, 0});
    return ++recvsPosted_;
  }

  void progress() override {
    // Nothing of ours waits on the peer, and it rejected nothing we sent: nothing to do (checkPeerAlive's idle case).
    // Inline and apart from the rest, so that such calls (most of an executor's, with several peers) cost no frame.
    if (sends_.empty() && recvs_.empty() && inEstablished_ && outEstablished_ && !failure_ &&
        out_.header->receiverFailed.load(std::memory_order_acquire) == 0) {
      waitPolls_ = 0;
      return;
    }
    progressWork();
  }

  [[gnu::noinline]] void progressWork() {
    if (failure_) throw *failure_;
    try {
      advanceHandshake();
      if (outEstablished_ && out_.header->receiverFailed.load(std::memory_order_acquire) != 0) {
        char text[sizeof(out_.header->failureText)];
        std::memcpy(text, out_.header->failureText, sizeof(text));
        text[sizeof(text) - 1] = '\0';
        throwRemoteError(peerName() + " failed on channel " + std::to_string(channel_) + ": " + text);
      }
      if (inEstablished_) receiveAvailable();
      if (outEstablished_) sendAvailable();
      checkPeerClosed();
      checkPeerAlive();
    } catch (const Error& e) {
      failure_ = e;
      throw;
    }
  }

  // Only when the engine is idle, not from progress(): help taken between two windows of our own receives delayed
  // them (2-rank all-to-all at 32 MiB: 13% slower).
  bool helpPeer() override {
    if (sharedCopyBytes_ == 0 || sends_.empty() || !outEstablished_ || failure_) return false;
    return helpReceiverCopy();
  }

  Ticket sendsCompleted() const override { return sendsCompleted_; }
  Ticket recvsCompleted() const override { return recvsCompleted_; }
  int peer() const override { return peerRank_; }
  const char* transportName() const override { return "shm"; }
  std::string describe() const override { return "shm to rank " + std::to_string(peerRank_) + " (pid " + std::to_string(peerPid_) + ") channel " + std::to_string(channel_); }

  bool armDoorbells(std::vector<ArmedDoorbell>& armed) override {
    if (failure_) return false;
    if (!recvs_.empty()) {
      if (!inEstablished_) return false;
      arm(in_.header->receiverBell, armed);
    }
    if (!sends_.empty()) {
      if (!outEstablished_) return false;
      arm(out_.header->senderBell, armed);
    }
    return true;
  }

  ShmConnectionStats stats() const {
    ShmConnectionStats s;
    s.established = inEstablished_ && outEstablished_;
    s.cmaReceive = inEstablished_ && in_.header->cmaThreshold != 0;
    s.cmaSend = outEstablished_ && outCmaThreshold_ != 0;
    s.fifoMessagesReceived = fifoMessagesReceived_;
    s.slotMessagesReceived = slotMessagesReceived_;
    s.cmaMessagesReceived = cmaMessagesReceived_;
    s.zeroCopyReceive = inEstablished_ && in_.header->zeroCopyThreshold != 0;
    s.zeroCopySend = outEstablished_ && outZeroCopyThreshold_ != 0;
    s.zeroCopyMessagesReceived = zeroCopyMessagesReceived_;
    s.mirroredMessagesReceived = mirroredMessagesReceived_;
    s.resultMirrorsWritten = resultMirrorsWritten_;
    s.senderMirroredMessages = senderMirroredMessages_;
    s.sharedCopyOffers = sharedCopyOffers_;
    s.blocksCopiedBySender = blocksCopiedBySender_;
    s.blocksCopiedForReceiver = blocksCopiedForReceiver_;
    return s;
  }

 private:
  std::string peerName() const { return "shm peer rank " + std::to_string(peerRank_) + " (pid " + std::to_string(peerPid_) + ")"; }
  std::string onChannel() const { return " on channel " + std::to_string(channel_); }

  // Receiver side: create, size and initialise our incoming segment. Never waits for the peer.
  void createIncomingSegment() {
    const ShmFifoLayout layout = shmFifoLayout();
    const SegmentGeometry g = geometryFor(layout.descriptorCount, layout.payloadBytes);
    const std::string name = shmSegmentName(commHash_, peerRank_, selfRank_, channel_);
    const std::string what = "segment " + name + " for receives from rank " + std::to_string(peerRank_) + onChannel();
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
      removeStaleSegment(name, what);
      fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0) throwSystemError("shm transport: creating " + what);
    UniqueFd owned(fd);
    inName_.adopt(name);  // from here on, any failure removes it again
    if (::ftruncate(fd, static_cast<off_t>(g.totalBytes)) != 0) throwSystemError("shm transport: sizing " + what);
    // Reserve the pages now: a full /dev/shm must be an error here, not SIGBUS mid-transfer.
    if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(g.totalBytes)); rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
      errno = rc;
      throwSystemError("shm transport: reserving " + std::to_string(g.totalBytes) + " bytes for " + what + " (is /dev/shm full?)");
    }
    in_.bind(mapShared(fd, g.totalBytes, what), layout);
    touchPages(in_.mapping.bytes(), in_.mapping.size(), false);
    auto* header = new (in_.mapping.bytes()) SegmentHeader{};
    in_.header = header;
    header->magic = kSegmentMagic;
    header->version = kLayoutVersion;
    header->descriptorCount = static_cast<uint32_t>(layout.descriptorCount);
    header->payloadBytes = layout.payloadBytes;
    header->fragmentBytes = layout.fragmentBytes;
    header->totalBytes = g.totalBytes;
    header->commHash = commHash_;
    header->receiverPid = selfPid_;
    header->receiverPidNamespace = pidNamespace();
    header->senderPid = peerPid_;
    header->senderRank = peerRank_;
    header->receiverRank = selfRank_;
    header->channel = channel_;
    header->state.store(kReady, std::memory_order_release);
  }

  // Only this rank ever creates this name, so an existing one is left over from a crashed run
  // with the same commHash (NCCL_COMM_ID), unless this very process connected twice.
  void removeStaleSegment(const std::string& name, const std::string& what) {
    UniqueFd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0));
    struct stat st {};
    if (fd.get() >= 0 && ::fstat(fd.get(), &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(SegmentHeader)) {
      void* address = ::mmap(nullptr, sizeof(SegmentHeader), PROT_READ, MAP_SHARED, fd.get(), 0);
      if (address != MAP_FAILED) {
        const auto* header = static_cast<const SegmentHeader*>(address);
        const bool ours = header->magic == kSegmentMagic && header->receiverPid == selfPid_;
        ::munmap(address, sizeof(SegmentHeader));
        if (ours) throwInvalidUsage("shm transport: rank " + std::to_string(selfRank_) + " connected twice to rank " +
                                    std::to_string(peerRank_) + onChannel() + " (" + what + " exists)");
      }
    }
    TOPOCCL_INFO(log::kShm, "shm: removing stale %s", name.c_str());
    ::shm_unlink(name.c_str());
  }

  void advanceHandshake() {
    if (!inEstablished_ && in_.header->state.load(std::memory_order_acquire) == kAttached) establishIncoming();
    if (!outAttached_) tryAttachOutgoing();
    if (outAttached_ && !outEstablished_ && out_.header->state.load(std::memory_order_acquire) == kEstablished) {
      outCmaThreshold_ = out_.header->cmaThreshold;
      outZeroCopyThreshold_ = out_.header->zeroCopyThreshold;
      outEstablished_ = true;
      // Messages up to this size may go straight into their slot (postSend): what publishSends sends as tiny.
      uint64_t direct = kSlotMessageBytes;
      if (outCmaThreshold_ != 0) direct = std::min(direct, outCmaThreshold_ - 1);
      if (outZeroCopyThreshold_ != 0) direct = std::min(direct, outZeroCopyThreshold_ - 1);
      directSendMaxBytes_ = static_cast<int64_t>(direct);
      TOPOCCL_INFO(log::kShm, "shm: rank %d -> rank %d channel %d connected, %zu slots, %zu-byte ring in fragments of up to %zu bytes, CMA %s, zero copy %s",
                   selfRank_, peerRank_, channel_, out_.descriptorCount, out_.payloadBytes, out_.fragmentBytes, outCmaThreshold_ ? "on" : "off",
                   outZeroCopyThreshold_ ? ("from " + std::to_string(outZeroCopyThreshold_) + " B").c_str() : "off");
    }
  }

  // Receiver side, once the sender attached: decide whether CMA works, publish the decision.
  void establishIncoming() {
    SegmentHeader* header = in_.header;
    uint64_t threshold = cmaThreshold_;
    if (threshold != 0 && !probeCma(header->senderProbeAddress)) threshold = 0;
    header->cmaThreshold = threshold;
    uint64_t zeroCopy = zeroCopyThreshold_;
    if (zeroCopy != 0 && !probeSharing(header->senderShareProbeFd, header->senderShareProbeInode)) zeroCopy = 0;
    header->zeroCopyThreshold = zeroCopy;
    header->state.store(kEstablished, std::memory_order_release);
    inEstablished_ = true;
    inName_.unlink();  // both sides have it mapped: nothing needs the name any more
  }

  bool probeCma(uint64_t remoteAddress) {
    if (cmaUnsupportedByKernel.load(std::memory_order_relaxed)) return false;
    uint64_t value = 0;
    iovec local{&value, sizeof(value)};
    iovec remote{reinterpret_cast<void*>(remoteAddress), sizeof(value)};
    const ssize_t n = ::process_vm_readv(static_cast<pid_t>(peerPid_), &local, 1, &remote, 1, 0);
    if (n == static_cast<ssize_t>(sizeof(value)) && value == kCmaProbeValue) return true;
    const int error = n < 0 ? errno : 0;
    if (error == ESRCH) throwRemoteError(peerName() + " exited during connect" + onChannel());
    if (error == ENOSYS) cmaUnsupportedByKernel.store(true, std::memory_order_relaxed);
    TOPOCCL_INFO(log::kShm, "shm: process_vm_readv from rank %d (pid %" PRId64 ") unavailable (%s); large messages use the FIFO",
                 peerRank_, peerPid_, error ? std::strerror(error) : "probe mismatch");
    return false;
  }

  // Whether we can map the sender's shared allocations: open its probe page through /proc and read it.
  bool probeSharing(int64_t fd, uint64_t inode) {
    if (fd < 0) return false;
    try {
      const PeerAllocation& probe = peerAllocation(static_cast<int>(fd), inode, sizeof(uint64_t));
      uint64_t value = 0;
      std::memcpy(&value, probe.mapping.bytes(), sizeof(value));
      if (value == kShareProbeValue) return true;
      TOPOCCL_INFO(log::kShm, "shm: the shared probe page of rank %d holds an unexpected value; zero copy off", peerRank_);
    } catch (const Error& e) {
      TOPOCCL_INFO(log::kShm, "shm: cannot map shared allocations of rank %d (%s); its large messages use the FIFO",
                   peerRank_, e.what());
    }
    peerAllocations_.clear();
    return false;
  }

  // A view of one of the sender's shared allocations, opened through /proc/<pid>/fd and kept (a few, most
  // recent first) since collectives send from the same buffers again and again. Read-write: a mirrored send
  // has us write into the sender's memory (the handshake's probe page proves that we may).
  struct PeerAllocation {
    int fd = -1;
    uint64_t inode = 0;
    SharedMapping mapping;
  };
  static constexpr size_t kPeerAllocationsKept = 32;

  const PeerAllocation& peerAllocation(int fd, uint64_t inode, uint64_t bytes) {
    for (size_t i = 0; i < peerAllocations_.size(); ++i) {
      if (peerAllocations_[i].fd != fd || peerAllocations_[i].inode != inode) continue;
      if (peerAllocations_[i].mapping.size() < bytes) break;  // cannot be: same inode, same size
      if (i != 0) std::rotate(peerAllocations_.begin(), peerAllocations_.begin() + static_cast<long>(i), peerAllocations_.begin() + static_cast<long>(i) + 1);
      return peerAllocations_.front();
    }
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%" PRId64 "/fd/%d", peerPid_, fd);
    UniqueFd opened(::open(path, O_RDWR | O_CLOEXEC));
    if (opened.get() < 0) {
      if (errno == ENOENT && !processAlive(peerPid_)) throwRemoteError(peerName() + " exited during receive" + onChannel());
      throwSystemError(std::string("shm transport: opening ") + path + ", a shared buffer of " + peerName() + onChannel());
    }
    struct stat st {};
    if (::fstat(opened.get(), &st) != 0) throwSystemError(std::string("shm transport: fstat of ") + path);
    if (static_cast<uint64_t>(st.st_ino) != inode || static_cast<uint64_t>(st.st_size) < bytes) {
      throwRemoteError(peerName() + " released a shared send buffer before the send completed" + onChannel() + " (" +
                       path + " is another file now)");
    }
    void* address = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, opened.get(), 0);
    if (address == MAP_FAILED) throwSystemError(std::string("shm transport: mapping ") + path + " of " + peerName());
    if (peerAllocations_.size() == kPeerAllocationsKept) peerAllocations_.pop_back();
    peerAllocations_.insert(peerAllocations_.begin(), PeerAllocation{fd, inode, SharedMapping(address, static_cast<size_t>(st.st_size))});
    return peerAllocations_.front();
  }

  // One copy (or reduce) straight out of the sender's buffer. Resumable, like pullWithCma.
  // With `mirror` (the kSharedMirror slot after it), the bytes also go to that allocation of the sender's, a
  // block at a time: the block read for the receive is still in L1 when it is copied to the mirror.
  bool pullShared(PendingRecv& recv, const SlotDescriptor& slot, const SlotDescriptor* mirror, size_t& budget) {
    const SharedSource source = mapSharedSource(recv, slot, mirror);
    while (recv.offset < recv.bytes) {
      if (budget == 0) return false;
      const size_t piece = std::min({recv.bytes - recv.offset, budget, kZeroCopyPiece});
      applyShared(recv, source, recv.offset, piece);
      recv.offset += piece;
      budget -= piece;
    }
    return true;
  }

  // The sender's buffer of a kSharedBuffer message, and its mirror (null: none), mapped here.
  struct SharedSource {
    const unsigned char* base = nullptr;
    unsigned char* mirror = nullptr;
    bool resultMirror = false;  // the mirror gets the receive's destination bytes, not the sender's
  };
  SharedSource mapSharedSource(const PendingRecv& recv, const SlotDescriptor& slot, const SlotDescriptor* mirror) {
    const auto malformed = [&](const SlotDescriptor& s) {
      return s.shared.offset > s.shared.allocationBytes || recv.bytes > s.shared.allocationBytes - s.shared.offset;
    };
    if (malformed(slot) || (mirror != nullptr && malformed(*mirror))) {
      throwRemoteError(peerName() + " sent a malformed shared-buffer descriptor" + onChannel());
    }
    // Pointers, not references: a second lookup may reorder the kept mappings (it never drops the first).
    SharedSource source;
    source.base = peerAllocation(slot.shared.fd, slot.shared.inode, slot.shared.offset + recv.bytes).mapping.bytes() + slot.shared.offset;
    if (mirror != nullptr) {
      source.mirror = peerAllocation(mirror->shared.fd, mirror->shared.inode, mirror->shared.offset + recv.bytes).mapping.bytes() +
                      mirror->shared.offset;
      source.resultMirror = (slot.shared.flags & kResultMirror) != 0;
    }
    return source;
  }

  // Bytes [at, at + bytes) of a zero-copy message: applied to the receive and, with a mirror, copied into it a
  // block at a time, while the block read for the receive is still in L1.
  static void applyShared(const PendingRecv& recv, const SharedSource& source, size_t at, size_t bytes) {
    if (source.mirror == nullptr) {
      applyAt(recv, source.base + at, at, bytes);
      return;
    }
    for (size_t done = 0; done < bytes; done += kMirrorBlock) {
      const size_t from = at + done;
      const size_t block = std::min(kMirrorBlock, bytes - done);
      applyAt(recv, source.base + from, from, block);
      // A result mirror in place is the sender's buffer itself: this block of it is read by now.
      const unsigned char* bytesOut = source.resultMirror ? static_cast<const unsigned char*>(recv.action.dst) + from : source.base + from;
      if (recv.action.copy) recv.action.copy(source.mirror + from, bytesOut, block);
      else std::memcpy(source.mirror + from, bytesOut, block);
    }
  }

  // Receiver: a plain copy of a large zero-copy message into a shared allocation of ours is offered to the sender,
  // which waits idle for it otherwise (a broadcast's root): two cores copy it, each block once (CopyOffer).
  void offerSharedCopy(PendingRecv& recv) {
    if (sharedCopyBytes_ == 0 || recv.action.operand != nullptr || recv.bytes < sharedCopyBytes_ ||
        recv.bytes / kSharedCopyBlock >= (uint64_t{1} << 31)) {
      return;
    }
    const std::optional<SharedRange> destination = findShared(recv.action.dst, recv.bytes);
    if (!destination) return;
    SegmentHeader* header = in_.header;
    const uint64_t sequence = inTail_ + 1;  // the message's slot, as the sender numbered it
    // The sender's increments for the previous offer all came before that message completed, and a claim against
    // it fails on the tag: both counters are ours to reset.
    header->copyBlocksBySender.store(0, std::memory_order_relaxed);
    header->copyClaims.store(copyClaimsTag(sequence), std::memory_order_relaxed);
    CopyOffer& offer = header->copyOffer;
    offer.fd = destination->fd;
    offer.flags = 0;
    offer.inode = destination->inode;
    offer.allocationBytes = destination->allocationBytes;
    offer.offset = destination->offset;
    offer.messageBytes = recv.bytes;
    offer.blockBytes = kSharedCopyBlock;
    // No ring: a sender that sleeps is not waiting on this message alone, and waking it costs more than a block
    // (a 2-rank broadcast's root, the case this is for, spins or yields, and helps as much without one).
    offer.sequence.store(sequence, std::memory_order_release);
    recv.offered = true;
    ++sharedCopyOffers_;
  }

  // Receiver: our share of an offered copy. Complete once every block is claimed and the sender's are copied.
  bool pullSharedTogether(PendingRecv& recv, const SlotDescriptor& slot, const SlotDescriptor* mirror, size_t& budget) {
    SegmentHeader* header = in_.header;
    const uint64_t blocks = (recv.bytes + kSharedCopyBlock - 1) / kSharedCopyBlock;
    if (!recv.claimsExhausted) {
      const SharedSource source = mapSharedSource(recv, slot, mirror);
      while (true) {
        if (budget == 0) return false;
        // Relaxed: the claim only has to be unique; the sender's bytes are ordered by copyBlocksBySender.
        const uint64_t block = header->copyClaims.fetch_add(1, std::memory_order_relaxed) & 0xffffffffull;
        if (block >= blocks) break;
        const size_t at = block * kSharedCopyBlock;
        const size_t bytes = std::min(kSharedCopyBlock, recv.bytes - at);
        applyShared(recv, source, at, bytes);
        ++recv.ownBlocks;
        budget -= std::min(budget, bytes);
      }
      recv.claimsExhausted = true;
    }
    if (header->copyBlocksBySender.load(std::memory_order_acquire) != blocks - recv.ownBlocks) return false;  // its last ones
    blocksCopiedBySender_ += blocks - recv.ownBlocks;
    recv.offset = recv.bytes;
    return true;
  }

  // Sender: while a zero-copy send of ours waits for the receiver, copy blocks of it that the receiver offered to
  // share (CopyOffer) straight into its destination. Whatever goes wrong here only means we do not help: the
  // receiver copies every block nobody claimed.
  bool helpReceiverCopy() {
    SegmentHeader* header = out_.header;
    const uint64_t sequence = header->copyOffer.sequence.load(std::memory_order_acquire);
    if (sequence == 0 || sequence == offerDeclined_ || sends_.empty() || sends_.front().offerSequence > sequence) return false;
    PendingSend* send = nullptr;
    for (size_t i = 0; i < nextToPublish_ && send == nullptr; ++i)
      if (sends_[i].offerSequence == sequence) send = &sends_[i];
    if (send == nullptr) return false;
    const CopyOffer& offer = header->copyOffer;
    const int fd = offer.fd;
    const uint64_t inode = offer.inode, allocationBytes = offer.allocationBytes, offset = offer.offset;
    const uint64_t messageBytes = offer.messageBytes, blockBytes = offer.blockBytes;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (header->copyOffer.sequence.load(std::memory_order_relaxed) != sequence) return false;  // replaced while we read it
    if (messageBytes != send->bytes || blockBytes == 0 || offset > allocationBytes || messageBytes > allocationBytes - offset ||
        (messageBytes + blockBytes - 1) / blockBytes >= (uint64_t{1} << 31)) {
      TOPOCCL_WARN("shm: %s offered a malformed shared copy (%" PRIu64 " bytes in blocks of %" PRIu64 " for a send of %zu); not helping",
                   peerName().c_str(), messageBytes, blockBytes, send->bytes);
      offerDeclined_ = sequence;
      return false;
    }
    unsigned char* destination = nullptr;
    try {
      destination = peerAllocation(fd, inode, offset + messageBytes).mapping.bytes() + offset;
    } catch (const Error& e) {
      TOPOCCL_INFO(log::kShm, "shm: cannot map the receive buffer of rank %d (%s); it copies our messages alone", peerRank_, e.what());
      sharedCopyBytes_ = 0;
      return false;
    }
    const uint64_t blocks = (messageBytes + blockBytes - 1) / blockBytes;
    const uint64_t tag = copyClaimsTag(sequence);
    const CopyFn copy = send->copy != nullptr ? send->copy : [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); };
    unsigned char* mirror = send->receiverWritesMirror ? send->mirror : nullptr;  // else written at publish, or none
    size_t budget = kSharedCopyBytesPerProgress;
    bool copied = false;
    while (budget > 0) {
      uint64_t claim = header->copyClaims.load(std::memory_order_relaxed);
      do {
        if ((claim & ~0xffffffffull) != tag || (claim & 0xffffffffull) >= blocks) budget = 0;
      } while (budget > 0 && !header->copyClaims.compare_exchange_weak(claim, claim + 1, std::memory_order_relaxed));
      if (budget == 0) break;
      const size_t at = (claim & 0xffffffffull) * blockBytes;
      const size_t bytes = std::min<uint64_t>(blockBytes, messageBytes - at);
      for (size_t done = 0; done < bytes; done += kMirrorBlock) {  // each piece read once into L1, written twice
        const size_t piece = std::min(kMirrorBlock, bytes - done);
        copy(destination + at + done, send->data + at + done, piece);
        if (mirror != nullptr) copy(mirror + at + done, send->data + at + done, piece);
      }
      header->copyBlocksBySender.fetch_add(1, std::memory_order_release);
      ++blocksCopiedForReceiver_;
      budget -= std::min(budget, bytes);
      copied = true;
    }
    if (copied) ring(header->receiverBell);
    return copied;
  }

  // Sender side: the receiver creates the segment whenever it gets to connect(); keep trying.
  void tryAttachOutgoing() {
    UniqueFd fd(::shm_open(outName_.c_str(), O_RDWR | O_CLOEXEC, 0));
    if (fd.get() < 0) {
      if (errno == ENOENT) return;
      throwSystemError("shm transport: opening segment " + outName_ + " for sends to rank " + std::to_string(peerRank_));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throwSystemError("shm transport: fstat of segment " + outName_);
    const size_t size = static_cast<size_t>(st.st_size);
    if (size < sizeof(SegmentHeader)) return;  // the receiver is still sizing it
    SharedMapping mapping = mapShared(fd.get(), size, "segment " + outName_);
    auto* header = std::launder(reinterpret_cast<SegmentHeader*>(mapping.bytes()));
    if (header->state.load(std::memory_order_acquire) == kCreating) return;
    // A leftover from an earlier run carries other pids; wait for the receiver to replace it.
    if (header->magic != kSegmentMagic || header->receiverPid != peerPid_ || header->senderPid != selfPid_) return;
    if (header->version != kLayoutVersion || header->commHash != commHash_ || header->senderRank != selfRank_ ||
        header->receiverRank != peerRank_ || header->channel != channel_ || header->descriptorCount == 0 ||
        header->fragmentBytes == 0 || header->fragmentBytes > kMaxSlotBytes || header->fragmentBytes % kAlign != 0 ||
        header->payloadBytes % kAlign != 0 || 2 * header->fragmentBytes > header->payloadBytes || header->totalBytes != size ||
        geometryFor(header->descriptorCount, header->payloadBytes).totalBytes != size) {
      throwRemoteError("shm transport: segment " + outName_ + " from " + peerName() + " has an unexpected layout");
    }
    header->senderProbeAddress = reinterpret_cast<uint64_t>(&cmaProbe);
    const std::optional<SharedRange> probe = params::kShmZeroCopy.get() ? shareProbe() : std::nullopt;
    header->senderShareProbeFd = probe ? probe->fd : -1;
    header->senderShareProbeInode = probe ? probe->inode : 0;
    uint32_t expected = kReady;
    if (!header->state.compare_exchange_strong(expected, kAttached, std::memory_order_acq_rel)) {
      throwInvalidUsage("shm transport: rank " + std::to_string(selfRank_) + " connected twice to rank " +
                        std::to_string(peerRank_) + onChannel());
    }
    out_.bind(std::move(mapping), ShmFifoLayout{header->descriptorCount, header->payloadBytes, header->fragmentBytes});
    touchPages(out_.mapping.bytes(), static_cast<size_t>(out_.payload - out_.mapping.bytes()), false);
    touchPages(out_.payload, out_.payloadBytes, true);  // nothing is published yet: ours alone
    payloadEndAt_.assign(2 * out_.descriptorCount, 0);
    outAttached_ = true;
    ::shm_unlink(outName_.c_str());  // the receiver does this too; whoever is first wins
  }

  // Receiver: apply every slot that has arrived to the posted receives, in order.
  void receiveAvailable() {
    const uint64_t tailBefore = inTailPublished_;
    receiveSlots();
    if (inTailPublished_ != tailBefore) ring(in_.header->senderBell);  // the sender may wait for room or for its buffer
  }

  void receiveSlots() {
    size_t budget = kCmaBytesPerProgress;
    SegmentHeader* header = in_.header;
    while (!recvs_.empty()) {
      PendingRecv& recv = recvs_.front();
      if (recv.offset == 0 && recv.bytes > kTinyBytes && recv.bytes <= kSlotMessageBytes) {
        // The message will likely span slots: ask for them with the descriptor, not after it.
        size_t index = in_.slotIndex(inTail_);
        for (size_t i = std::min(continuationSlotsFor(recv.bytes), in_.descriptorCount - 1); i > 0; --i)
          __builtin_prefetch(&in_.descriptors[index = in_.nextIndex(index)], 0, 3);
      }
      if (!incomingSlotReady()) {
        publishTail();  // caught up: whatever we hold back, the sender may need for its next message
        return;
      }
      const SlotDescriptor& slot = in_.slotDescriptor(inTail_);
      if (slot.messageBytes != recv.bytes) reportSizeMismatch(recv.bytes, slot.messageBytes);
      if (slot.kind == kTinyMessage) {
        if (slot.offset != 0 || recv.offset != 0 || slot.fragmentBytes != recv.bytes || recv.bytes > kSlotMessageBytes ||
            continuationSlotsFor(recv.bytes) >= in_.descriptorCount) {
          throwRemoteError(peerName() + " sent a malformed small message" + onChannel());
        }
        const size_t continuations = continuationSlotsFor(recv.bytes);
        takeSlotMessage(recv, slot, continuations);
        completeRecv();
      } else if (slot.kind == kInlineFragment) {
        if (slot.offset != recv.offset || slot.fragmentBytes > in_.fragmentBytes || slot.fragmentBytes > recv.bytes - recv.offset ||
            slot.payloadOffset % kAlign != 0 || slot.payloadOffset + slot.fragmentBytes > in_.payloadBytes) {
          throwRemoteError(peerName() + " sent a malformed fragment" + onChannel());
        }
        applyAt(recv, in_.payload + slot.payloadOffset, recv.offset, slot.fragmentBytes);  // reduce straight out of the ring
        recv.offset += slot.fragmentBytes;
        releaseIncomingSlot();
        if (recv.offset == recv.bytes) {
          ++fifoMessagesReceived_;
          completeRecv();
        }
      } else if (slot.kind == kSharedBuffer && header->zeroCopyThreshold != 0) {
        if (slot.offset != 0 || (slot.shared.flags & ~(kMirrorFollows | kResultMirror)) != 0 ||
            slot.shared.flags == kResultMirror) {
          throwRemoteError(peerName() + " sent a malformed shared-buffer descriptor" + onChannel());
        }
        const bool resultMirror = (slot.shared.flags & kResultMirror) != 0;
        if (resultMirror && recv.action.resultMirrored == nullptr) {
          reportToSender("a send asked for the result of a receive of " + std::to_string(recv.bytes) +
                         " bytes in its memory, but that receive's plan step returns none (do both ranks run the same plan?)");
        }
        const SlotDescriptor* mirror = nullptr;
        if ((slot.shared.flags & kMirrorFollows) != 0) {
          // Published before this slot, so visible now.
          mirror = &in_.slotDescriptor(inTail_ + 1);
          if (mirror->sequence.load(std::memory_order_acquire) != inTail_ + 2 || mirror->kind != kSharedMirror ||
              mirror->messageBytes != slot.messageBytes) {
            throwRemoteError(peerName() + " sent a shared-buffer descriptor without its mirror" + onChannel());
          }
        }
        if (recv.offset == 0 && !recv.offered && !resultMirror) offerSharedCopy(recv);
        if (!(recv.offered ? pullSharedTogether(recv, slot, mirror, budget) : pullShared(recv, slot, mirror, budget))) return;
        releaseIncomingSlot();  // the sender's buffer is free again
        if (mirror != nullptr) {
          releaseIncomingSlot();  // and its mirror written
          ++mirroredMessagesReceived_;
        }
        if (resultMirror) {
          *recv.action.resultMirrored = 1;
          ++resultMirrorsWritten_;
        }
        ++zeroCopyMessagesReceived_;
        completeRecv();
      } else if (slot.kind == kCmaDescriptor && header->cmaThreshold != 0) {
        if (!pullWithCma(recv, slot.cmaAddress, budget)) return;
        releaseIncomingSlot();  // this is the sender's acknowledgement: its buffer is free again
        ++cmaMessagesReceived_;
        completeRecv();
      } else {
        throwRemoteError(peerName() + " sent a malformed slot (kind " + std::to_string(slot.kind) + ")" + onChannel());
      }
    }
  }

  // The rest of a kTinyMessage, in the slots after its descriptor (published before it, so visible now). Pieces are
  // whole elements (kTinyBytes and kContinuationBytes are multiples of every element size), so each is applied where
  // it lands: a copy moves each piece once, straight from its slot; a reduction reduces it there.
  void receiveContinuations(const PendingRecv& recv, const SlotDescriptor& slot, size_t continuations) {
    static_assert(kTinyBytes % 8 == 0 && kContinuationBytes % 8 == 0, "slot pieces hold whole elements of up to 8 bytes");
    const bool wholeElements = recv.action.operand == nullptr || (recv.action.elementSize != 0 && 8 % recv.action.elementSize == 0);
    alignas(kAlign) unsigned char gathered[kSlotMessageBytes];  // only for an element size that could straddle slots
    const auto apply = [&](const unsigned char* piece, size_t at, size_t bytes) {
      if (!wholeElements) std::memcpy(gathered + at, piece, bytes);
      else if (recv.action.operand == nullptr) std::memcpy(static_cast<unsigned char*>(recv.action.dst) + at, piece, bytes);
      else applyAt(recv, piece, at, bytes);
    };
    // Every slot checked before any byte lands: a malformed message leaves the destination (perhaps an in-place
    // reduction's input) untouched.
    const size_t first = in_.nextIndex(in_.slotIndex(inTail_));
    for (size_t i = 1, index = first; i <= continuations; ++i, index = in_.nextIndex(index))
      if (in_.descriptors[index].sequence.load(std::memory_order_relaxed) != inTail_ + i + 1)
        throwRemoteError(peerName() + " sent a small message with a missing continuation slot" + onChannel());
    apply(slot.tiny, 0, kTinyBytes);
    size_t at = kTinyBytes;
    for (size_t i = 1, index = first; i <= continuations; ++i, index = in_.nextIndex(index), at += kContinuationBytes) {
      const SlotDescriptor& next = in_.descriptors[index];
      apply(continuationBytes(next), at, i < continuations ? kContinuationBytes : recv.bytes - at);
    }
    if (!wholeElements) applyAt(recv, gathered, 0, recv.bytes);
  }

  // A kTinyMessage of `continuations` slots after its descriptor at inTail_, into recv; then releases its slots.
  void takeSlotMessage(const PendingRecv& recv, const SlotDescriptor& slot, size_t continuations) {
    if (continuations == 0) {
      applyAt(recv, slot.tiny, 0, recv.bytes);
    } else {
      receiveContinuations(recv, slot, continuations);
      ++slotMessagesReceived_;
    }
    releaseIncomingSlots(1 + continuations, /*urgent=*/false);
    ++fifoMessagesReceived_;
  }

  bool incomingSlotReady() const {
    return in_.slotDescriptor(inTail_).sequence.load(std::memory_order_acquire) == inTail_ + 1;
  }

  // Slots whose payload room or sender's buffer the sender waits for are released at once. Small messages' slots
  // (their sends completed at publish) are released a quarter of the FIFO at a time, or when we catch up with the
  // sender: each release is a store to a line the sender reads while it waits for room, and a fence, which would
  // wait for that line once per message of a stream (perf/RESULTS.md, session 28). At most a quarter of the slots
  // are held back, and none while we wait, so a sender that needs room always gets it.
  void releaseIncomingSlot() { releaseIncomingSlots(1); }
  void releaseIncomingSlots(size_t count, bool urgent = true) {
    inTail_ += count;
    if (urgent || inTail_ - inTailPublished_ >= std::max<size_t>(1, in_.descriptorCount / 4)) publishTail();
  }
  void publishTail() {
    if (inTailPublished_ != inTail_) in_.header->tail.store(inTailPublished_ = inTail_, std::memory_order_release);
  }

  void completeRecv() {
    recvs_.pop_front();
    ++recvsCompleted_;
  }

  [[noreturn]] void reportSizeMismatch(size_t expected, size_t sent) {
    reportToSender("receive of " + std::to_string(expected) + " bytes matched a send of " + std::to_string(sent) + " bytes");
  }

  // Fails this receive and tells the sender why (it reads receiverFailed in its progress()).
  [[noreturn]] void reportToSender(const std::string& what) {
    SegmentHeader* header = in_.header;
    std::snprintf(header->failureText, sizeof(header->failureText), "%s", what.c_str());
    header->receiverFailed.store(1, std::memory_order_release);
    ring(header->senderBell);
    throwRemoteError(peerName() + onChannel() + ": " + what);
  }

  static void applyAt(const PendingRecv& recv, const void* incoming, size_t offset, size_t bytes) {
    if (bytes == 0) return;
    auto* dst = static_cast<unsigned char*>(recv.action.dst) + offset;
    if (recv.action.operand == nullptr) {
      if (recv.action.copy) recv.action.copy(dst, incoming, bytes);
      else std::memcpy(dst, incoming, bytes);
    } else {
      const auto* operand = static_cast<const unsigned char*>(recv.action.operand) + offset;
      recv.action.reduce(dst, incoming, operand, bytes / recv.action.elementSize);
    }
  }

  // One copy: plain receives land in dst directly; reduces go through a bounded staging buffer.
  // Resumable: returns false when this call's budget ran out before the message was done.
  bool pullWithCma(PendingRecv& recv, uint64_t remoteAddress, size_t& budget) {
    const bool reducing = recv.action.operand != nullptr;
    while (recv.offset < recv.bytes) {
      if (budget == 0) return false;
      const size_t remaining = recv.bytes - recv.offset;
      if (!reducing) {
        const size_t piece = std::min(remaining, budget);
        readRemote(static_cast<unsigned char*>(recv.action.dst) + recv.offset, remoteAddress + recv.offset, piece);
        recv.offset += piece;
        budget -= piece;
      } else {
        const size_t piece = std::min(remaining, kCmaStagingBytes);
        if (staging_.size() < piece) staging_.resize(kCmaStagingBytes);
        readRemote(staging_.data(), remoteAddress + recv.offset, piece);
        applyAt(recv, staging_.data(), recv.offset, piece);
        recv.offset += piece;
        budget -= std::min(budget, piece);
      }
    }
    return true;
  }

  void readRemote(void* into, uint64_t remoteAddress, size_t bytes) {
    auto* cursor = static_cast<unsigned char*>(into);
    while (bytes > 0) {
      iovec local{cursor, bytes};
      iovec remote{reinterpret_cast<void*>(remoteAddress), bytes};
      const ssize_t n = ::process_vm_readv(static_cast<pid_t>(peerPid_), &local, 1, &remote, 1, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == ESRCH) throwRemoteError(peerName() + " exited during receive" + onChannel());
        if (errno == EFAULT) throwRemoteError(peerName() + " released a send buffer before the send completed" + onChannel());
        throwSystemError("shm transport: process_vm_readv of " + std::to_string(bytes) + " bytes from " + peerName() + onChannel());
      }
      if (n == 0) throwRemoteError(peerName() + " send buffer became unreadable" + onChannel());
      cursor += n;
      remoteAddress += static_cast<uint64_t>(n);
      bytes -= static_cast<size_t>(n);
    }
  }

  // Sender: fill free slots with the queued sends in order, then retire what has completed.
  // The receiver's tail is read only when the FIFO looks full or a CMA send waits for it: each
  // read of it is a cache line that the receiver owns.
  void sendAvailable() {
    const uint64_t headBefore = outHead_;
    publishSends();
    if (outHead_ != headBefore) ring(out_.header->receiverBell);
    retireCompletedSends();
  }

  // postSend's shortcut for a message of up to directSendMaxBytes_: nothing queued before it, nothing failed, its
  // slots free.
  bool directSendAllowed(size_t continuations) {
    return sends_.empty() && !failure_ && out_.header->receiverFailed.load(std::memory_order_relaxed) == 0 &&
           claimOutgoingSlots(1 + continuations);
  }
  void publishDirect(const unsigned char* data, size_t bytes) {
    const size_t continuations = continuationSlotsFor(bytes);
    SlotDescriptor& slot = out_.slotDescriptor(outHead_);
    writeSlotMessage(slot, data, bytes, continuations);
    publishSlot(slot, continuations);
    ring(out_.header->receiverBell);
  }

  // Whether `count` more slots are free, looking at the receiver's tail again only when our copy says no.
  bool claimOutgoingSlots(size_t count) {
    if (outHead_ + count - outTailSeen_ <= out_.descriptorCount) return true;
    outTailSeen_ = out_.header->tail.load(std::memory_order_acquire);
    return outHead_ + count - outTailSeen_ <= out_.descriptorCount;
  }

  // A message of up to kSlotMessageBytes: its first kTinyBytes in the descriptor at outHead_, the rest in the
  // `continuations` slots after it, written now and made visible by the descriptor's publication.
  void writeSlotMessage(SlotDescriptor& slot, const unsigned char* data, size_t bytes, size_t continuations) {
    slot.messageBytes = bytes;
    slot.offset = 0;
    slot.fragmentBytes = static_cast<uint32_t>(bytes);
    slot.kind = kTinyMessage;
    if (bytes > 0) std::memcpy(slot.tiny, data, std::min(bytes, kTinyBytes));
    if (continuations == 0) return;
    size_t index = out_.slotIndex(outHead_);
    size_t at = kTinyBytes;
    for (size_t i = 1; i <= continuations; ++i, at += kContinuationBytes) {
      SlotDescriptor& next = out_.descriptors[index = out_.nextIndex(index)];
      if (i < continuations) std::memcpy(continuationBytes(next), data + at, kContinuationBytes);  // a fixed size: inline
      else std::memcpy(continuationBytes(next), data + at, bytes - at);
      next.sequence.store(outHead_ + i + 1, std::memory_order_relaxed);  // made visible by the descriptor's release
    }
    // The receiver releases a message's slots together, so its tail never stops inside one: only the last slot's
    // entry is ever read.
    payloadEndAt_[(outHead_ + continuations) % payloadEndAt_.size()] = payloadHead_;
  }

  // Makes the slot at outHead_ (and the continuation slots already written after it) visible to the receiver.
  void publishSlot(SlotDescriptor& slot, size_t continuationSlots) {
    payloadEndAt_[outHead_ % payloadEndAt_.size()] = payloadHead_;
    slot.sequence.store(outHead_ + 1, std::memory_order_release);
    outHead_ += 1 + continuationSlots;
  }

  void publishSends() {
    while (nextToPublish_ < sends_.size()) {
      if (!claimOutgoingSlots(1)) break;
      PendingSend& send = sends_[nextToPublish_];
      if (send.resultMirror) {  // zero copy was promised at post; the allocations outlive the send
        const std::optional<SharedRange> data = findShared(send.data, send.bytes);
        const std::optional<SharedRange> mirror = findShared(send.mirror, send.bytes);
        if (!data || !mirror) throwInternalError(describe() + ": a result-mirrored send's buffers are no longer shared allocations");
        if (!publishMirrored(send, *data, *mirror, kResultMirror)) break;
        continue;
      }
      std::optional<SharedRange> shared;
      const uint64_t zeroCopyFrom = send.readEarly ? std::min(outZeroCopyThreshold_, readEarlyBytes_) : outZeroCopyThreshold_;
      if (outZeroCopyThreshold_ != 0 && !send.copyOut && send.offset == 0 && send.bytes >= zeroCopyFrom)
        shared = findShared(send.data, send.bytes);
      if (send.mirror != nullptr && shared && out_.descriptorCount >= 2) {
        if (const std::optional<SharedRange> mirror = findShared(send.mirror, send.bytes)) {
          if (!publishMirrored(send, *shared, *mirror)) break;
          continue;
        }
      }
      SlotDescriptor& slot = out_.slotDescriptor(outHead_);
      slot.messageBytes = send.bytes;
      size_t continuationSlots = 0;  // published with this slot: it goes last
      if (shared) {
        slot.offset = 0;
        slot.fragmentBytes = 0;
        slot.kind = kSharedBuffer;
        slot.shared.fd = shared->fd;
        slot.shared.flags = 0;
        slot.shared.inode = shared->inode;
        slot.shared.allocationBytes = shared->allocationBytes;
        slot.shared.offset = shared->offset;
        send.releasedAtTail = outHead_ + 1;
        send.offerSequence = outHead_ + 1;
        send.offset = send.bytes;
      } else if (outCmaThreshold_ != 0 && !send.copyOut && send.bytes >= outCmaThreshold_) {
        slot.offset = 0;
        slot.fragmentBytes = 0;
        slot.kind = kCmaDescriptor;
        slot.cmaAddress = reinterpret_cast<uint64_t>(send.data);
        send.releasedAtTail = outHead_ + 1;
        send.offset = send.bytes;
      } else if (send.offset == 0 && send.bytes <= kSlotMessageBytes &&
                 continuationSlotsFor(send.bytes) < out_.descriptorCount) {
        const size_t continuations = continuationSlotsFor(send.bytes);
        if (!claimOutgoingSlots(1 + continuations)) break;
        writeSlotMessage(slot, send.data, send.bytes, continuations);
        send.offset = send.bytes;
        continuationSlots = continuations;
      } else {
        const size_t fragment = std::min(out_.fragmentBytes, send.bytes - send.offset);
        const std::optional<uint64_t> at = reservePayload(fragment);
        if (!at) break;
        std::memcpy(out_.payload + *at, send.data + send.offset, fragment);
        slot.offset = send.offset;
        slot.fragmentBytes = static_cast<uint32_t>(fragment);
        slot.kind = kInlineFragment;
        slot.payloadOffset = *at;
        send.offset += fragment;
      }
      const size_t publishedFrom = slot.offset;  // where this slot's bytes start in the message
      publishSlot(slot, continuationSlots);
      if (send.mirror != nullptr) {
        // Our half of a mirrored send the receiver cannot write. After publishing, so a polling peer need not wait
        // for it (a sleeping one is rung once, after the loop); the bytes just copied in are still in this core's
        // cache, so they are read from memory once.
        std::memcpy(send.mirror + publishedFrom, send.data + publishedFrom, send.offset - publishedFrom);
      }
      if (send.offset == send.bytes) {
        send.published = true;
        ++nextToPublish_;
        if (send.mirror != nullptr) ++senderMirroredMessages_;
      }
    }
  }

  // A mirrored send takes two slots: kSharedBuffer naming the data, then kSharedMirror naming the mirror. The
  // mirror's slot is published first, so a receiver that sees the first sees both. False while two are not free.
  // extraFlags: kResultMirror.
  bool publishMirrored(PendingSend& send, const SharedRange& data, const SharedRange& mirror, uint32_t extraFlags = 0) {
    if (!claimOutgoingSlots(2)) return false;
    const auto describeRange = [&](SlotDescriptor& slot, const SharedRange& range, SlotKind kind, uint32_t flags) {
      slot.messageBytes = send.bytes;
      slot.offset = 0;
      slot.fragmentBytes = 0;
      slot.kind = kind;
      slot.shared.fd = range.fd;
      slot.shared.flags = flags;
      slot.shared.inode = range.inode;
      slot.shared.allocationBytes = range.allocationBytes;
      slot.shared.offset = range.offset;
    };
    SlotDescriptor& first = out_.slotDescriptor(outHead_);
    SlotDescriptor& second = out_.slotDescriptor(outHead_ + 1);
    describeRange(first, data, kSharedBuffer, kMirrorFollows | extraFlags);
    describeRange(second, mirror, kSharedMirror, 0);
    payloadEndAt_[outHead_ % payloadEndAt_.size()] = payloadHead_;
    payloadEndAt_[(outHead_ + 1) % payloadEndAt_.size()] = payloadHead_;
    second.sequence.store(outHead_ + 2, std::memory_order_release);
    first.sequence.store(outHead_ + 1, std::memory_order_release);
    send.offerSequence = outHead_ + 1;
    send.receiverWritesMirror = true;
    outHead_ += 2;
    send.releasedAtTail = outHead_;
    send.offset = send.bytes;
    send.published = true;
    ++nextToPublish_;
    return true;
  }

  // Where in the payload ring `bytes` contiguous bytes go, or nullopt while the receiver still holds
  // them. The ring is released in descriptor order: everything before the payload end recorded with
  // the last released descriptor is free. A fragment that would cross the ring's end starts over at 0.
  std::optional<uint64_t> reservePayload(size_t bytes) {
    const uint64_t need = alignUp(bytes, kAlign);
    const uint64_t position = payloadHead_ % out_.payloadBytes;
    const uint64_t skip = position + need > out_.payloadBytes ? out_.payloadBytes - position : 0;
    const auto released = [&] { return outTailSeen_ == 0 ? 0 : payloadEndAt_[(outTailSeen_ - 1) % payloadEndAt_.size()]; };
    if (payloadHead_ + skip + need - released() > out_.payloadBytes) {
      outTailSeen_ = out_.header->tail.load(std::memory_order_acquire);
      if (payloadHead_ + skip + need - released() > out_.payloadBytes) return std::nullopt;
    }
    payloadHead_ += skip;
    const uint64_t offset = payloadHead_ % out_.payloadBytes;
    payloadHead_ += need;
    return offset;
  }

  void retireCompletedSends() {
    if (!sends_.empty() && sends_.front().published && outTailSeen_ < sends_.front().releasedAtTail)
      outTailSeen_ = out_.header->tail.load(std::memory_order_acquire);  // the receiver's CMA reads are done
    while (!sends_.empty() && sends_.front().published && outTailSeen_ >= sends_.front().releasedAtTail) {
      sends_.pop_front();
      --nextToPublish_;
      ++sendsCompleted_;
    }
  }

  // The operation that is waiting on the peer, if any. A peer that finished its part and left
  // is no error while nothing of ours depends on it.
  const char* waitingOperation() const {
    if (!recvs_.empty()) return inEstablished_ ? "receive" : "connect";
    if (!sends_.empty()) return outEstablished_ ? "send" : "connect";
    return nullptr;
  }

  void checkPeerClosed() {
    if (!recvs_.empty() && inEstablished_ && in_.header->senderClosed.load(std::memory_order_acquire) != 0 &&
        !incomingSlotReady()) {
      throwRemoteError(peerName() + " closed the connection during receive" + onChannel());
    }
    if (!sends_.empty() && outAttached_ && out_.header->receiverClosed.load(std::memory_order_acquire) != 0) {
      retireCompletedSends();  // it may have consumed the last of them just before closing
      if (!sends_.empty()) throwRemoteError(peerName() + " closed the connection during " + waitingOperation() + onChannel());
    }
  }

  // Only while we wait on the peer, at most every kLivenessInterval: the fast path makes no
  // syscalls (steady_clock is served by the vDSO).
  void checkPeerAlive() {
    const char* operation = waitingOperation();
    if (operation == nullptr) {
      waitPolls_ = 0;
      return;
    }
    if (peerExited_) {
      // Seen in an earlier call, so this call's passes already saw everything the peer published and
      // released: whatever it published before exiting has been delivered, unless still queued.
      const bool undelivered = !recvs_.empty() && inEstablished_ && incomingSlotReady();
      if (!undelivered) throwRemoteError(peerName() + " exited during " + operation + onChannel());
    }
    // A short wait (the common case) never reads the clock.
    if ((++waitPolls_ % kPollsPerClockRead) != 0) return;
    const auto now = Clock::now();
    if (waitPolls_ == kPollsPerClockRead) {
      lastLivenessCheck_ = now;
    } else if (now - lastLivenessCheck_ >= kLivenessInterval) {
      lastLivenessCheck_ = now;
      peerExited_ = !processAlive(peerPid_);
    }
    const bool blockedOnHandshake = (!recvs_.empty() && !inEstablished_) || (!sends_.empty() && !outEstablished_);
    if (blockedOnHandshake && connectDeadline_ && now > *connectDeadline_) {
      throwRemoteError(peerName() + " did not complete the connection" + onChannel() + " within " +
                       std::to_string(params::kTimeoutMs.get()) + " ms (" + params::kTimeoutMs.name() + ")");
    }
  }

  const uint64_t commHash_;
  const int selfRank_;
  const int64_t selfPid_;
  const int peerRank_;
  const int64_t peerPid_;
  const int channel_;
  uint64_t cmaThreshold_ = 0;  // what we offer for our incoming direction
  std::optional<Clock::time_point> connectDeadline_;

  // Incoming direction: we created the segment and are its receiver.
  SegmentName inName_;
  SegmentView in_;
  bool inEstablished_ = false;
  uint64_t inTail_ = 0;           // the next slot we read
  uint64_t inTailPublished_ = 0;  // what the sender sees: header->tail (releaseIncomingSlots)
  RingQueue<PendingRecv> recvs_;
  Ticket recvsPosted_ = 0;
  Ticket recvsCompleted_ = 0;
  std::vector<unsigned char> staging_;
  uint64_t fifoMessagesReceived_ = 0;
  uint64_t slotMessagesReceived_ = 0;
  uint64_t cmaMessagesReceived_ = 0;
  uint64_t zeroCopyMessagesReceived_ = 0;
  uint64_t mirroredMessagesReceived_ = 0;
  uint64_t resultMirrorsWritten_ = 0;
  uint64_t senderMirroredMessages_ = 0;
  uint64_t sharedCopyOffers_ = 0;
  uint64_t blocksCopiedBySender_ = 0;
  uint64_t blocksCopiedForReceiver_ = 0;
  uint64_t sharedCopyBytes_ = 0;  // offer (and help with) copies of at least this many bytes; 0 = never
  uint64_t offerDeclined_ = 0;    // the malformed offer we last refused
  uint64_t zeroCopyThreshold_ = 0;  // what we offer for our incoming direction
  std::vector<PeerAllocation> peerAllocations_;

  // Outgoing direction: the peer created the segment; we are its sender.
  std::string outName_;
  SegmentView out_;
  bool outAttached_ = false;
  bool outEstablished_ = false;
  uint64_t outCmaThreshold_ = 0;
  uint64_t outZeroCopyThreshold_ = 0;
  // postSendReadEarly's zero-copy size: kZeroCopyBytesOwnCores, unless TOPOCCL_SHM_ZERO_COPY_THRESHOLD names one.
  uint64_t readEarlyBytes_ = kZeroCopyBytesOwnCores;
  int64_t directSendMaxBytes_ = -1;  // postSend publishes messages up to this size itself; -1 until established
  uint64_t outHead_ = 0;
  uint64_t outTailSeen_ = 0;  // the receiver's tail when we last looked
  uint64_t payloadHead_ = 0;  // payload ring bytes ever reserved
  std::vector<uint64_t> payloadEndAt_;  // payloadHead_ after descriptor n, at n % size (2 x descriptors: in flight <= 1 x)
  RingQueue<PendingSend> sends_;
  size_t nextToPublish_ = 0;  // sends_[0, nextToPublish_) are fully in the FIFO
  Ticket sendsPosted_ = 0;
  Ticket sendsCompleted_ = 0;

  uint64_t waitPolls_ = 0;  // progress() calls since something of ours began waiting on the peer
  bool peerExited_ = false;
  Clock::time_point lastLivenessCheck_{};
  std::optional<Error> failure_;  // once broken, every later progress() repeats the first error
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(const CommIdentity& identity, const PeerInfo& self, size_t zeroCopyThreshold)
      : identity_(identity), self_(self), zeroCopyThreshold_(zeroCopyThreshold) {}

  const char* name() const override { return "shm"; }

  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    return !params::kShmDisable.get() && self.hostId == peer.hostId && self.processToken != peer.processToken;
  }

  std::unique_ptr<Connection> connect(const PeerInfo& peer, int channel) override {
    if (peer.rank < 0 || (identity_.nranks > 0 && peer.rank >= identity_.nranks) || peer.rank == identity_.rank) {
      throwInvalidArgument("shm transport: cannot connect rank " + std::to_string(identity_.rank) + " to rank " +
                           std::to_string(peer.rank) + " of " + std::to_string(identity_.nranks));
    }
    if (peer.pid <= 0) throwInvalidArgument("shm transport: rank " + std::to_string(peer.rank) + " has no pid");
    if (channel < 0) throwInvalidArgument("shm transport: channel " + std::to_string(channel) + " is negative");
    return std::make_unique<ShmConnection>(identity_, self_, peer, channel, zeroCopyThreshold_);
  }

 private:
  CommIdentity identity_;
  PeerInfo self_;
  size_t zeroCopyThreshold_;
};

}  // namespace

ShmFifoLayout shmFifoLayout() {
  const int64_t buffSize = params::kBuffSize.get();
  const int64_t slots = params::kShmSlots.get();
  const int64_t fragments = params::kShmFragments.get();
  if (slots < 1 || slots > 65536) {
    throwInvalidArgument(std::string(params::kShmSlots.name()) + "=" + std::to_string(slots) + " must be between 1 and 65536");
  }
  if (fragments < 2 || fragments > 4096) {
    throwInvalidArgument(std::string(params::kShmFragments.name()) + "=" + std::to_string(fragments) + " must be between 2 and 4096");
  }
  if (buffSize < static_cast<int64_t>(2 * kAlign) || static_cast<uint64_t>(buffSize) > (uint64_t{1} << 40)) {
    throwInvalidArgument(std::string(params::kBuffSize.name()) + "=" + std::to_string(buffSize) + " must be between 128 bytes and 1 TiB");
  }
  ShmFifoLayout layout;
  layout.descriptorCount = static_cast<size_t>(slots);
  layout.payloadBytes = static_cast<size_t>(buffSize) / kAlign * kAlign;
  layout.fragmentBytes = std::max(kAlign, layout.payloadBytes / static_cast<size_t>(fragments) / kAlign * kAlign);
  layout.fragmentBytes = std::min(layout.fragmentBytes, kMaxSlotBytes);
  return layout;
}

std::string shmSegmentName(uint64_t commHash, int sender, int receiver, int channel) {
  char name[96];
  std::snprintf(name, sizeof(name), "/topoccl-%016" PRIx64 "-%d-%d-%d", commHash, sender, receiver, channel);
  return name;
}

ShmConnectionStats shmConnectionStats(const Connection& connection) {
  const auto* shm = dynamic_cast<const ShmConnection*>(&connection);
  if (shm == nullptr) throwInvalidUsage(std::string("shmConnectionStats: ") + connection.describe() + " is not a shm connection");
  return shm->stats();
}

std::vector<std::string> removeShmSegmentsOfExitedRanks() {
  std::vector<std::string> removed;
  const uint64_t ourNamespace = pidNamespace();
  if (ourNamespace == 0) return removed;  // no way to tell whose pids the headers hold
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return removed;
  while (const dirent* entry = ::readdir(dir)) {
    if (std::strncmp(entry->d_name, "topoccl-", 8) != 0) continue;
    const std::string name = "/" + std::string(entry->d_name);
    UniqueFd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || st.st_uid != ::geteuid() ||
        static_cast<size_t>(st.st_size) < sizeof(SegmentHeader)) {
      continue;
    }
    void* address = ::mmap(nullptr, sizeof(SegmentHeader), PROT_READ, MAP_SHARED, fd.get(), 0);
    if (address == MAP_FAILED) continue;
    const auto* header = static_cast<const SegmentHeader*>(address);
    // Only a finished header of this layout is trusted; one being written has state kCreating.
    const bool ready = header->magic == kSegmentMagic && header->version == kLayoutVersion &&
                       header->state.load(std::memory_order_acquire) != kCreating;
    const int64_t pid = header->receiverPid;
    const bool orphaned = ready && header->receiverPidNamespace == ourNamespace && pid > 0 &&
                          ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    ::munmap(address, sizeof(SegmentHeader));
    if (orphaned && ::shm_unlink(name.c_str()) == 0) {
      TOPOCCL_INFO(log::kShm, "shm: removed %s, left by pid %" PRId64 ", which exited before its peer attached", name.c_str(), pid);
      removed.push_back(name);
    }
  }
  ::closedir(dir);
  return removed;
}

std::unique_ptr<Transport> makeShmTransport(const CommIdentity& identity, const PeerInfo& self, size_t zeroCopyThreshold) {
  static std::once_flag swept;  // once per process: the names only pile up across runs
  std::call_once(swept, [] { removeShmSegmentsOfExitedRanks(); });
  return std::make_unique<ShmTransport>(identity, self, zeroCopyThreshold);
}

}  // namespace topoccl::transport

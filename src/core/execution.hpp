// The plan executor's engine: lanes of resolved steps (pointers, byte counts, connections) run as
// resumable state machines. progress() never blocks; the communicator's progress engine drives it.
// Collective plans and grouped send/recv are both lowered to this form, so one engine runs both.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/plan.hpp"
#include "core/copy_tuner.hpp"
#include "core/execution_trace.hpp"
#include "core/host_arena.hpp"
#include "kernels/host_reduce.hpp"
#include "transport/transport.hpp"

namespace topoccl::core {

// How a send is handed to its connection (transport.hpp): as is, copied out (never read in place by the peer, so it
// completes once copied), or read early (read in place from a smaller size than the connection's default).
enum class SendRoute : uint8_t { Plain, CopyOut, ReadEarly };

struct ResolvedStep {
  algo::StepKind kind = algo::StepKind::Nop;
  const char* src = nullptr;
  char* dst = nullptr;
  size_t bytes = 0;
  std::vector<algo::StepRef> deps;
  // A Send whose bytes a later Copy of its lane also writes to `mirror` (fuseMirroredCopies): where the
  // connection can, the receiver writes them there too and that Copy (step `mirrorCopyStep`) is skipped.
  char* mirror = nullptr;
  size_t mirrorCopyStep = 0;
  // A receive into bytes a send of this rank reads (in place, fuseStagedReceives): a peer has just read those
  // lines, so the receive moves its bytes with Execution::setCopy's sentBytesCopy.
  bool intoSentBytes = false;
  // algo::Step::waitsOutOwnSends: a slice over bytes a send of ours still reads waits for it, never bounces.
  bool waitsOutOwnSends = false;
  // Result mirrors (algo::Step::resultReturnsIn / sendsResultOf, linked by linkResultMirrors). On a Send:
  // `resultMirror` is the destination of this rank's Recv `resultStep`, which skips each slice the peer wrote there.
  // On the peer's Send of the result: `resultStep` is the receive-reduce it follows, whose slices that wrote their
  // result into our peer's memory it skips. On that receive-reduce: `returnsResult`.
  char* resultMirror = nullptr;
  std::optional<algo::StepRef> resultReturnsIn{};
  std::optional<algo::StepRef> sendsResultOf{};
  std::optional<algo::StepRef> mirroredBy{};  // on the Recv `resultReturnsIn` names: the Send whose slices it skips
  bool returnsResult = false;
  // How a sending step's bytes are posted (markSendRoutes): postSend, postSendCopyOut or postSendReadEarly.
  SendRoute route = SendRoute::Plain;
  // How the step is cut, set by Execution (sliceBytesFor): computed once, not on every run of the step.
  size_t sliceBytes = 0;
  size_t slices = 0;
};

struct ResolvedLane {
  transport::Connection* sendConn = nullptr;
  transport::Connection* recvConn = nullptr;
  std::vector<ResolvedStep> steps;
  std::string label;  // for stall reports: "lane 0 (send rank 1, recv rank 3, channel 0)"
};

// Receives (and receive-reduces) into scratch that a Copy right after them in the lane moves to their real place
// (the staged in-place plans: all-to-all lands peer blocks in scratch while its sends still read the output; 2-rank
// recursive doubling reduces into scratch while the peer still reads the buffer) become receives into that place,
// and the Copy a Nop: the executor's bounce slots then hold each slice only until
// the send reading its destination completes, in cache, instead of a whole block in memory and a second
// pass over it. Only where nothing else of this rank touches that scratch and the Copy waits on nothing else, where a
// reduction's operand is either exactly the new destination or apart from it, and only when no slice can exceed a bounce slot (maxSliceBytes <= Execution::kMaxBounceSliceBytes): a
// larger slice would wait on our own send, which may wait on the peer's receive, which waits the same way.
// Returns how many receives it redirected.
size_t fuseStagedReceives(std::vector<ResolvedLane>& lanes, const char* scratch, size_t scratchBytes, size_t maxSliceBytes);

// A Send of [src, src + n) and a later Copy of the same bytes in the same lane to memory nothing else of this
// rank reads or writes (an out-of-place all-gather's or broadcast's own block) become one mirrored send: the
// Send names the Copy's destination, and at run time, where the connection can mirror (shm, both buffers from
// ncclMemAlloc), the peer writes the block there in the pass that reads it, so it crosses memory once instead of
// twice; elsewhere the Copy runs as before. Only where the Copy waits on nothing else and nothing writes the
// source. Returns how many pairs it marked.
size_t fuseMirroredCopies(std::vector<ResolvedLane>& lanes);

// Checks the plan's result-mirror marks (algo::Step::resultReturnsIn, sendsResultOf) against the resolved lanes and
// links them: a Send's mirror is its Recv's destination (same peer, same size), and the Recv and the receive-reduce
// learn which step's slices they skip or flag. A mark that does not fit is dropped, with its steps run as they are.
// Returns how many marks it linked.
size_t linkResultMirrors(std::vector<ResolvedLane>& lanes);

// Which sends leave the connection's default (SendRoute).
struct SendRule {
  // CopyOut: a Send of at most this many bytes a step whose bytes a receive of the operation may overwrite while it
  // is in flight (in place: recursive doubling's send of the buffer it then reduces into, an all-to-all's swap). Read
  // in place by the peer, such a send completes only once the peer has read it, and until then every receive slice
  // over it waits in a bounce slot, then crosses the caches again when copied back; copied out, the receive lands at
  // once. A receive that finishes before the send starts (earlier in its lane, or one the send's lane waits for) is
  // no hazard: a relay forwards what it received in place.
  size_t overwrittenUpTo = 0;
  // ReadEarly: a send (or a receive's forward) below this many bytes, not overwritten, after which the rank still
  // has a receive of the operation to do: its wait for the peer's read overlaps that work. A rank with nothing left
  // to receive (a broadcast's root and relays, a reduce's leaves) keeps the default: where ranks share cores it would
  // wait for readers the scheduler has yet to run.
  size_t readEarlyBelow = 0;
};
// Sets each sending step's route by the rule; returns how many it moved off Plain.
size_t markSendRoutes(std::vector<ResolvedLane>& lanes, const SendRule& rule);

// Where ranks share cores, sends below this size with receives to follow are read early: the connections' default
// zero-copy size there (transport::kZeroCopyBytesSharingCores), so larger ones go zero copy anyway.
inline constexpr size_t kSharedCoreReadEarlyBelow = 32 << 10;

// The default. Where the rank has a core of its own: overwritten sends up to half the core's own cache
// (coreCacheBytes; 512 KiB when unknown), where the copy into the FIFO stays in cache (2-rank in-place all-reduce and
// all-to-all at 32 KiB-1 MiB 1.2-2.8x faster; session 44); every other send is read in place from the connection's
// size already. Where ranks share cores: no copy out (it takes CPU time the others need: in place, 4-rank all-to-all
// at 128 KiB 1.2x slower with it up to 32 KiB, session 45), and sends with receives still to do are read early (4
// ranks on 2 CPUs, session 45: all-reduce at 8-16 KiB and all-gather, all-to-all and reduce-scatter at 32-64 KiB
// 1.7-2.2x faster).
constexpr SendRule defaultSendRule(size_t coreCacheBytes, bool sharesCores) {
  if (sharesCores) return {0, kSharedCoreReadEarlyBelow};
  return {coreCacheBytes > 0 ? coreCacheBytes / 2 : size_t{512} << 10, 0};
}

class Execution {
 public:
  // A receive slice whose destination a pending send still reads lands in a bounce slot of the lane and is
  // copied over once the send completes, so the receive never waits on it (an in-place swap with a peer whose
  // send completes only when read would otherwise wait in a circle). Slices up to this size only.
  static constexpr size_t kMaxBounceSliceBytes = 4 << 20;
  // Shared memory: deep pipelines pay (2-rank all-reduce 1-4 MiB: 6.5-7 -> 9-13 GB/s busbw).
  static constexpr size_t kSlicesPerStep = 16;
  // Sockets: every slice costs syscalls on a CPU-bound loopback or NIC path; 2 slices of up to 512 KiB
  // measured 1.1-1.7x 16 at 2-8 MiB (perf/RESULTS.md).
  static constexpr size_t kSlicesPerStepSockets = 2;

  // `stagingArena` (grow-only, owned by the caller) holds RecvReduceSend results, so repeated
  // operations reuse warm memory; null means the execution allocates its own.
  // slicesPerStep: a step is cut into at least this many slices (of at most sliceBytes, at least 64 KiB);
  // every rank of a communicator must pass the same value, so that both ends of a transfer cut alike.
  Execution(std::string operation, std::vector<ResolvedLane> lanes, kernels::ReduceFn reduce,
            size_t elementSize, size_t sliceBytes, HostArena* stagingArena = nullptr,
            size_t slicesPerStep = kSlicesPerStep);
  Execution(const Execution&) = delete;
  Execution& operator=(const Execution&) = delete;

  // Moves every lane as far as it can without blocking. Returns true once all steps finished and
  // every send has completed. Throws topoccl::Error from transports, prefixed with the operation.
  bool progress();
  // Back to the start for another run of the same steps (same buffers): no allocation.
  void reset();
  // How plain copies and receives move bytes whose buffers do not overlap (kernels::streamingCopy past the
  // caches, kernels::bulkCopy inside them); null, the default: memcpy. `sentBytesCopy` moves bytes into memory a
  // send of ours reads (in place: a bounced slice, or a receive ResolvedStep::intoSentBytes), lines a peer has just
  // read and so still in the caches, where streaming stores would only evict them.
  void setCopy(transport::CopyFn copy, transport::CopyFn sentBytesCopy) {
    copy_ = copy;
    sentBytesCopy_ = sentBytesCopy;
  }
  // Both kernels' copies, where the communicator picks one per call (CopyTuner); useCopy sets one of them.
  struct CopyPair {
    transport::CopyFn copy = nullptr, sentBytesCopy = nullptr;
  };
  void setCopyChoices(CopyPair cached, CopyPair streaming, CopyKernel fallback, std::optional<CopyTuner::Shape> tuned) {
    copyChoices_ = {cached, streaming};
    fallbackCopy_ = fallback;
    tunedShape_ = tuned;
    useCopy(fallback);
  }
  void useCopy(CopyKernel kernel) {
    const CopyPair& pair = copyChoices_[static_cast<size_t>(kernel)];
    setCopy(pair.copy, pair.sentBytesCopy);
  }
  CopyKernel fallbackCopy() const { return fallbackCopy_; }
  // The shape the communicator times this operation's calls under; none: its copies are fixed.
  const std::optional<CopyTuner::Shape>& tunedShape() const { return tunedShape_; }
  bool movedLastTime() const { return moved_; }
  bool finished() const { return finished_; }
  const std::string& operation() const { return operation_; }
  // What each unfinished lane waits for, for timeout errors.
  std::string describeWaiting() const;
  // The descriptors of every connection, for an idle engine to poll(); false if any connection cannot
  // be waited on that way (see transport::Connection::addPollDescriptors).
  bool addPollDescriptors(std::vector<pollfd>& fds) const;
  // Arms every connection's doorbells, for an idle engine to sleep on; false if any connection cannot be
  // waited on that way (see transport::Connection::armDoorbells).
  bool armDoorbells(std::vector<transport::ArmedDoorbell>& armed);
  // Lets the connections do work for their peers while this run waits (Connection::helpPeer); whether any did.
  bool helpPeers();
  // Receive slices that landed in a bounce slot, over every run so far.
  size_t bouncedSlices() const { return bouncedSlices_; }
  // Result mirrors, over every run so far: slices of our receives the peer wrote straight into our memory, and
  // slices of our sends skipped because our receive had written their result into the peer's.
  size_t slicesWrittenByPeer() const { return slicesWrittenByPeer_; }
  size_t slicesWrittenToPeer() const { return slicesWrittenToPeer_; }
  // Records this run's call and steps in `trace` (null: none), from its next run on.
  void setTrace(ExecutionTrace* trace) { trace_ = trace; }
  // Sets how each send is posted (markSendRoutes).
  size_t routeSends(const SendRule& rule) { return markSendRoutes(lanes_, rule); }

 private:
  static constexpr size_t kWindow = 4;  // receive slices in flight per lane
  static constexpr size_t kMinSliceBytes = 64 << 10;
  static constexpr size_t kTrackedConnections = 64;  // bits of unflushed_

  struct InFlightSend {
    transport::Connection* conn;
    transport::Ticket ticket;
    const char* begin;
    const char* end;
  };

  struct LaneState {
    size_t step = 0;          // index of the current step; == steps.size() when done
    bool stepStarted = false;
    size_t sliceBytes = 0;    // this step's slice size (sliceBytesFor)
    size_t slices = 0;
    size_t slicesPosted = 0;  // receives posted
    size_t slicesDone = 0;    // receives completed (and forwarded)
    std::array<transport::Ticket, kWindow> recvTickets{};  // slice i's ticket at [i % kWindow]
    std::array<bool, kWindow> bounced{};                    // slice i landed in bounce slot [i % kWindow]
    // A Recv slice the peer writes as our result-mirrored send's mirror: done once that send's ticket completes.
    std::array<transport::Ticket, kWindow> mirrorTickets{};
    uint64_t sendBit = 0;     // the lane's connections in unflushed_ (set once)
    uint64_t recvBit = 0;
    std::chrono::steady_clock::time_point stepStart{};     // traced runs only
    std::chrono::steady_clock::time_point firstSliceAt{};  // a receive's first slice landed (traced runs only)
  };

  bool advanceLane(size_t laneIndex);
  bool depsSatisfied(const ResolvedStep& step) const;
  // True while a pending send reads [begin, end); drops the sends that completed. Inline while nothing is in flight
  // (the small-message case: sends complete when published).
  bool writeHazard(const char* begin, const char* end) { return !inFlight_.empty() && readByPendingSend(begin, end); }
  bool readByPendingSend(const char* begin, const char* end);
  void startStep(size_t laneIndex);
  void finishStep(size_t laneIndex);
  void postSend(const LaneState& state, transport::Connection* conn, const char* data, size_t bytes, char* mirror = nullptr,
                SendRoute route = SendRoute::Plain);
  void postSendSlices(size_t laneIndex, const ResolvedStep& step);  // a Send step's slices, all at once
  void flushPosted();  // progresses the connections in unflushed_
  bool pumpReceives(size_t laneIndex);
  size_t sliceLength(const LaneState& state, const ResolvedStep& step, size_t slice) const;
  size_t sliceBytesFor(size_t stepBytes) const;
  void placeStaging();  // RecvReduceSend regions in the arena (which may have grown since)

  std::string operation_;
  std::vector<ResolvedLane> lanes_;
  std::vector<LaneState> states_;
  std::vector<transport::Connection*> connections_;
  ExecutionTrace* trace_ = nullptr;
  uint32_t traceCall_ = 0;
  bool traceStarted_ = false;
  std::vector<InFlightSend> inFlight_;
  uint64_t unflushed_ = 0;  // connections_ (bit i: [i]) posted to since they last progressed
  // RecvReduceSend results, one region per such step: receives never wait for a send to finish,
  // which keeps transports that complete a send only when the peer consumed it deadlock-free.
  HostArena ownStaging_;
  HostArena* arena_ = nullptr;
  std::vector<std::vector<char*>> stagingOf_;  // [lane][step]
  std::vector<std::vector<char>> bounce_;      // [lane]: kWindow slots of kMaxBounceSliceBytes at most, made on first use
  std::vector<std::vector<size_t>> mirroredBytes_;  // [lane][step]: how much of that Copy the peer writes this run
  // Result mirrors, per slice, written as each slice is posted this run (so never reset): [lane][step] of a Send with
  // a resultMirror, the ticket of a slice the peer writes back (0: sent as usual); of a receive-reduce that
  // returnsResult, 1 where the transport wrote its result into the peer's memory. Empty for other steps.
  std::vector<std::vector<std::vector<transport::Ticket>>> mirroredSendTickets_;
  std::vector<std::vector<std::vector<uint8_t>>> resultWrittenBack_;
  kernels::ReduceFn reduce_;
  size_t elementSize_;
  size_t sliceBytes_;
  size_t slicesPerStep_;
  transport::CopyFn copy_ = nullptr;
  transport::CopyFn sentBytesCopy_ = nullptr;
  std::array<CopyPair, 2> copyChoices_{};
  CopyKernel fallbackCopy_ = CopyKernel::Cached;
  std::optional<CopyTuner::Shape> tunedShape_;
  size_t bouncedSlices_ = 0;
  size_t slicesWrittenByPeer_ = 0;
  size_t slicesWrittenToPeer_ = 0;
  bool hasStaging_ = false;    // some step is a RecvReduceSend (placeStaging has work)
  bool hasMirrors_ = false;    // some send is mirrored (mirroredBytes_ is reset per run)
  bool moved_ = false;
  bool posted_ = false;        // this run handed the transports something (before that they have nothing of it)
  uint64_t posts_ = 0;         // sends and receives posted, ever (a pass that posts nothing needs no second pass)
  bool copiedOutInFlight_ = false;  // a copyOut send posted since the connections last progressed from pumpReceives
  bool sendsToFlush_ = false;  // posted since the transports last progressed
  bool finished_ = false;
};

}  // namespace topoccl::core

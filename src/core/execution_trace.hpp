// What a rank's collectives actually did, step by step, for a timeline viewer (TOPOCCL_TRACE_FILE): each call and
// each step of each lane as a span with its bytes and peers, written as a Chrome trace (chrome://tracing, Perfetto,
// `ui.perfetto.dev`) when the communicator is destroyed. The schedule a plan describes and the one that ran differ
// by every wait on a peer, a core or a cache; this shows the second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "algorithms/plan.hpp"

namespace topoccl::core {

class ExecutionTrace {
 public:
  using Clock = std::chrono::steady_clock;

  // Up to `capacity` spans are kept (allocated here, once); later ones are counted as dropped.
  ExecutionTrace(int rank, int nranks, uint64_t commHash, size_t capacity);

  // A call starts: returns its id for stepDone and callDone.
  uint32_t callBegin(const std::string& operation);
  void callDone(uint32_t call);
  // One step of one lane ran from `start` until now; a receiving step's first slice landed at `firstSlice` (until
  // then it waited for its peer).
  void stepDone(uint32_t call, uint32_t lane, uint32_t step, algo::StepKind kind, uint64_t bytes, int sendPeer, int recvPeer,
                Clock::time_point start, Clock::time_point firstSlice);

  size_t spans() const { return spans_.size(); }
  uint64_t dropped() const { return dropped_; }

  // The trace as a Chrome trace JSON document.
  std::string toJson() const;
  // Writes it to `pattern` with %r the rank, %c the communicator (its hash, in hex: a split's files differ from its
  // parent's), %p the process id and %h the host name; returns the path. Throws
  // topoccl::Error (ncclSystemError) naming the path when it cannot be written.
  std::string write(const std::string& pattern) const;

 private:
  struct Span {
    int64_t startNs = 0;
    int64_t endNs = 0;
    int64_t firstSliceNs = 0;  // receiving steps
    uint32_t call = 0;
    int32_t lane = -1;  // -1: the call itself
    uint32_t step = 0;
    algo::StepKind kind = algo::StepKind::Nop;
    uint64_t bytes = 0;
    int32_t sendPeer = -1;
    int32_t recvPeer = -1;
  };
  struct Call {
    uint32_t name = 0;
    int64_t startNs = 0;
  };
  static int64_t nanos(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }
  void add(const Span& span);

  int rank_;
  int nranks_;
  uint64_t commHash_;
  size_t capacity_;
  std::vector<Span> spans_;
  std::vector<Call> calls_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> nameIndex_;
  uint64_t dropped_ = 0;
};

}  // namespace topoccl::core

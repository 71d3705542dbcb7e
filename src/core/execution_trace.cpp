#include "core/execution_trace.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.hpp"

namespace topoccl::core {

namespace {

const char* readableKind(algo::StepKind kind) {
  switch (kind) {
    case algo::StepKind::Nop: return "wait";
    case algo::StepKind::Send: return "send";
    case algo::StepKind::Recv: return "recv";
    case algo::StepKind::RecvReduceSend: return "recv-reduce-send";
    case algo::StepKind::RecvReduceCopy: return "recv-reduce-copy";
    case algo::StepKind::RecvCopySend: return "recv-copy-send";
    case algo::StepKind::RecvReduceCopySend: return "recv-reduce-copy-send";
    case algo::StepKind::Copy: return "copy";
    case algo::StepKind::Reduce: return "reduce";
  }
  return "step";
}

double micros(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

}  // namespace

ExecutionTrace::ExecutionTrace(int rank, int nranks, uint64_t commHash, size_t capacity)
    : rank_(rank), nranks_(nranks), commHash_(commHash), capacity_(capacity) {
  spans_.reserve(capacity_);
}

uint32_t ExecutionTrace::callBegin(const std::string& operation) {
  auto [it, inserted] = nameIndex_.try_emplace(operation, static_cast<uint32_t>(names_.size()));
  if (inserted) names_.push_back(operation);
  calls_.push_back({it->second, nanos(Clock::now())});
  return static_cast<uint32_t>(calls_.size() - 1);
}

void ExecutionTrace::callDone(uint32_t call) {
  Span span;
  span.startNs = calls_[call].startNs;
  span.endNs = nanos(Clock::now());
  span.call = call;
  add(span);
}

void ExecutionTrace::stepDone(uint32_t call, uint32_t lane, uint32_t step, algo::StepKind kind, uint64_t bytes, int sendPeer,
                              int recvPeer, Clock::time_point start, Clock::time_point firstSlice) {
  Span span;
  span.startNs = nanos(start);
  span.firstSliceNs = nanos(firstSlice);
  span.endNs = nanos(Clock::now());
  span.call = call;
  span.lane = static_cast<int32_t>(lane);
  span.step = step;
  span.kind = kind;
  span.bytes = bytes;
  span.sendPeer = sendPeer;
  span.recvPeer = recvPeer;
  add(span);
}

void ExecutionTrace::add(const Span& span) {
  if (spans_.size() < capacity_) spans_.push_back(span);
  else ++dropped_;
}

std::string ExecutionTrace::toJson() const {
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 0}, {"args", {{"name", "calls"}}}});
  std::set<int32_t> lanes;
  for (const Span& span : spans_)
    if (span.lane >= 0) lanes.insert(span.lane);
  for (int32_t lane : lanes)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", lane + 1}, {"args", {{"name", "lane " + std::to_string(lane)}}}});
  for (const Span& span : spans_) {
    const std::string& operation = names_[calls_[span.call].name];
    json event = {{"ph", "X"}, {"pid", rank_}, {"ts", micros(span.startNs)}, {"dur", micros(span.endNs - span.startNs)}};
    if (span.lane < 0) {
      event["name"] = operation;
      event["cat"] = "call";
      event["tid"] = 0;
      event["args"] = {{"call", span.call}};
    } else {
      std::string name = readableKind(span.kind);
      if (span.sendPeer >= 0 && algo::stepSends(span.kind)) name += " to " + std::to_string(span.sendPeer);
      if (span.recvPeer >= 0 && algo::stepReceives(span.kind)) name += " from " + std::to_string(span.recvPeer);
      event["name"] = name;
      event["cat"] = "step";
      event["tid"] = span.lane + 1;
      event["args"] = {{"call", span.call}, {"operation", operation}, {"lane", span.lane}, {"step", span.step},
                       {"kind", algo::stepKindName(span.kind)}, {"bytes", span.bytes}};
      // How long a receive waited for its peer before its first slice landed; the rest of it moved data.
      if (algo::stepReceives(span.kind) && span.bytes > 0) event["args"]["waited_us"] = micros(span.firstSliceNs - span.startNs);
    }
    events.push_back(std::move(event));
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ns"},
              {"otherData", {{"rank", rank_}, {"nranks", nranks_}, {"comm", commHash_}, {"calls", calls_.size()}, {"spans", spans_.size()},
                             {"dropped", dropped_}, {"clock", "steady_clock (CLOCK_MONOTONIC): ranks of one host share it"}}}};
  return doc.dump();
}

std::string ExecutionTrace::write(const std::string& pattern) const {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'r') { path += std::to_string(rank_); ++i; }
    else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') { path += std::to_string(getpid()); ++i; }
    else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'h') { path += host; ++i; }
    else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'c') {
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(commHash_));
      path += hex;
      ++i;
    }
    else path += pattern[i];
  }
  std::ofstream out(path, std::ios::trunc);
  if (!out) throwSystemError("TOPOCCL_TRACE_FILE: cannot open " + path + " for rank " + std::to_string(rank_) + "'s trace");
  out << toJson() << '\n';
  out.close();
  if (!out) throwSystemError("TOPOCCL_TRACE_FILE: writing " + path + " for rank " + std::to_string(rank_) + "'s trace failed");
  return path;
}

}  // namespace topoccl::core

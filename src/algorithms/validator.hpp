// The plan validator: proves, before a plan runs, that it is well formed, that its sends and
// receives pair up, that it cannot deadlock under the executor's rules, that no two unordered steps
// of a rank touch the same chunk, and that every output chunk ends up holding exactly what the
// collective requires. It is a symbolic execution: values are multisets of (rank, input chunk).
//
// Executor rules it assumes (src/core implements them):
// - A lane runs its steps in order; a step starts once its deps (steps of other lanes of the same
//   rank) and the previous step of its lane have completed their receive and local work.
// - Sends do not block, but a step that writes memory overlapping the source of a send of the same
//   rank that its peer has not yet received waits until it has been. A RecvReduceSend's staging is
//   internal, so it guards nothing.
// - The k-th send on a connection (sender, receiver, channel) matches the k-th receive on it.
// A plan claiming in-place validity is also run with Input and Output aliased per inPlaceAlias().
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/plan.hpp"
#include "nccl.h"

namespace topoccl::algo {

struct ValidationReport {
  std::vector<std::string> errors;  // one sentence each, naming rank / lane / step where it can
  size_t omittedErrors = 0;         // found beyond the stored maximum
  bool ok() const { return errors.empty(); }
  std::string text() const;  // "ok", or the errors one per line
};

ValidationReport validate(const Plan& plan);

// Throws topoccl::Error(code) whose message is the plan's name followed by the report.
// ncclInternalError suits built-in generators; ncclInvalidArgument suits plans a user supplied.
void validateOrThrow(const Plan& plan, ncclResult_t code = ncclInternalError);

}  // namespace topoccl::algo

// Hand-built executor steps for the tests of the resolution passes (fuseStagedReceives, fuseMirroredCopies).
#pragma once

#include "core/execution.hpp"

namespace topoccl::test {

inline core::ResolvedStep resolvedStep(algo::StepKind kind, const char* src, char* dst, size_t bytes) {
  core::ResolvedStep s;
  s.kind = kind;
  s.src = src;
  s.dst = dst;
  s.bytes = bytes;
  return s;
}

}  // namespace topoccl::test

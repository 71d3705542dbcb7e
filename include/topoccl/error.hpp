// The exception topoccl's C++ API throws: an NCCL status code plus a sentence a person can act on.
#pragma once

#include <stdexcept>
#include <string>

#include "nccl.h"

namespace topoccl {

class __attribute__((visibility("default"))) Error : public std::runtime_error {
 public:
  Error(ncclResult_t code, std::string message) : std::runtime_error(std::move(message)), code_(code) {}
  ncclResult_t code() const noexcept { return code_; }

 private:
  ncclResult_t code_;
};

}  // namespace topoccl

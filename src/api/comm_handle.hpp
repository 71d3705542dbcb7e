// What an ncclComm_t points at, and the registry that tells live handles from stale ones.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/communicator.hpp"

struct ncclComm {
  std::shared_ptr<topoccl::core::Communicator> impl;  // null until a grouped init completes
  int cudaDevice = -1;
  ncclResult_t initResult = ncclSuccess;  // non-blocking init: ncclInProgress until it finishes
  std::string initError;
  std::mutex opsMutex;
  std::map<int, topoccl::core::ReduceSpec> customOps;  // ncclRedOpCreatePreMulSum
  int nextCustomOp = ncclNumOps;
};

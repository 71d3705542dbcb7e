// Argument checks shared by the C API and the C++ API: every failure names the argument and the
// function, and throws topoccl::Error(ncclInvalidArgument).
#pragma once

#include <string>

#include "core/communicator.hpp"

namespace topoccl::api {

[[noreturn]] void badArgument(const char* function, const std::string& what);
void checkRank(int value, int nranks, const char* what, const char* function);
void checkPointer(const void* p, size_t count, const char* what, const char* function);
// Root, buffers, in-place layouts and overlap of one collective call on `rank`; sets args.root.
void checkCollectiveArguments(const char* function, int rank, int nranks, int root, core::CollectiveArgs& args);

}  // namespace topoccl::api

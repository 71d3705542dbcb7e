// Errors inside topoccl are exceptions carrying an NCCL status code and a sentence a person can act
// on; the C boundary (src/api) turns them into ncclResult_t plus ncclGetLastError text.
#pragma once

#include <stdexcept>
#include <string>

#include "nccl.h"
#include "topoccl/error.hpp"

namespace topoccl {

// Helpers that name the category in the type, so call sites read as the error they raise.
[[noreturn]] void throwInvalidArgument(const std::string& message);
[[noreturn]] void throwInvalidUsage(const std::string& message);
[[noreturn]] void throwSystemError(const std::string& message);  // appends strerror(errno)
[[noreturn]] void throwSystemErrorNoErrno(const std::string& message);
[[noreturn]] void throwRemoteError(const std::string& message);
[[noreturn]] void throwInternalError(const std::string& message);

const char* resultName(ncclResult_t code) noexcept;

}  // namespace topoccl

#include "common/error.hpp"

#include <cerrno>
#include <cstring>

namespace topoccl {

void throwInvalidArgument(const std::string& message) { throw Error(ncclInvalidArgument, message); }
void throwInvalidUsage(const std::string& message) { throw Error(ncclInvalidUsage, message); }
void throwSystemError(const std::string& message) {
  const int saved = errno;
  throw Error(ncclSystemError, message + ": " + std::strerror(saved));
}
void throwSystemErrorNoErrno(const std::string& message) { throw Error(ncclSystemError, message); }
void throwRemoteError(const std::string& message) { throw Error(ncclRemoteError, message); }
void throwInternalError(const std::string& message) { throw Error(ncclInternalError, message); }

const char* resultName(ncclResult_t code) noexcept {
  switch (code) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult(unknown)";
  }
}

}  // namespace topoccl

#include "transport/shm/shared_allocation.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "common/error.hpp"

namespace topoccl::transport {
namespace {

struct Allocation {
  size_t bytes;
  size_t mappedBytes;  // bytes rounded up to pages
  int fd;
  uint64_t inode;
};

// Keyed by base address; looked up once per large send, so a plain mutex is cheap enough.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> byBase;
};

Registry& registry() {
  static Registry* instance = new Registry;  // never destroyed: frees may run during static teardown
  return *instance;
}

}  // namespace

void* allocateShared(size_t bytes) {
  if (bytes == 0) throwInvalidArgument("shared allocation of 0 bytes");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (bytes + page - 1) / page * page;
  const int fd = ::memfd_create("topoccl-mem", MFD_CLOEXEC);
  if (fd < 0) throwSystemError("ncclMemAlloc: memfd_create for " + std::to_string(bytes) + " bytes");
  auto fail = [&](const std::string& what) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    throwSystemError("ncclMemAlloc: " + what + " for " + std::to_string(bytes) + " bytes");
  };
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) fail("ftruncate of the memfd");
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("fstat of the memfd");
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) fail("mmap of the memfd (is /dev/shm or the memlock limit too small?)");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.byBase[reinterpret_cast<uintptr_t>(base)] = {bytes, mapped, fd, static_cast<uint64_t>(st.st_ino)};
  return base;
}

bool freeShared(void* base) {
  Allocation found{};
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.byBase.find(reinterpret_cast<uintptr_t>(base));
    if (it == r.byBase.end()) return false;
    found = it->second;
    r.byBase.erase(it);
  }
  // Peers that mapped it keep their view of the pages; the memory goes once they unmap too.
  ::munmap(base, found.mappedBytes);
  ::close(found.fd);
  return true;
}

std::optional<SharedRange> findShared(const void* data, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.byBase.upper_bound(begin);
  if (it == r.byBase.begin()) return std::nullopt;
  --it;
  const Allocation& a = it->second;
  const uintptr_t offset = begin - it->first;
  if (offset > a.bytes || bytes > a.bytes - offset) return std::nullopt;
  return SharedRange{a.fd, a.inode, a.bytes, offset};
}

}  // namespace topoccl::transport

// NCCL_DEBUG-compatible logging: "host:pid:tid [rank] NCCL INFO message". Levels and subsystem
// names follow NCCL so existing habits (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET) keep working.
#pragma once

#include <cstdarg>
#include <cstdint>

namespace topoccl::log {

enum class Level : int { None = 0, Version = 1, Warn = 2, Info = 3, Trace = 4 };

enum Subsys : uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kGraph = 1u << 5,
  kTuning = 1u << 6,
  kEnv = 1u << 7,
  kAlloc = 1u << 8,
  kCall = 1u << 9,
  kProxy = 1u << 10,
  kBootstrap = 1u << 11,
  kAll = ~0u,
};

bool enabled(Level level, uint32_t subsys) noexcept;
void write(Level level, uint32_t subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void setThreadRank(int rank) noexcept;  // shown as [rank] in every line from this thread
void reload() noexcept;                 // re-read NCCL_DEBUG* (tests)

}  // namespace topoccl::log

#define TOPOCCL_LOG(level, subsys, ...)                                                     \
  do {                                                                                     \
    if (::topoccl::log::enabled(level, subsys)) ::topoccl::log::write(level, subsys, __VA_ARGS__); \
  } while (0)
#define TOPOCCL_WARN(...) TOPOCCL_LOG(::topoccl::log::Level::Warn, ::topoccl::log::kAll, __VA_ARGS__)
#define TOPOCCL_INFO(subsys, ...) TOPOCCL_LOG(::topoccl::log::Level::Info, subsys, __VA_ARGS__)
#define TOPOCCL_TRACE(subsys, ...) TOPOCCL_LOG(::topoccl::log::Level::Trace, subsys, __VA_ARGS__)

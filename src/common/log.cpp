#include "common/log.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "common/params.hpp"

namespace topoccl::log {
namespace {

struct State {
  std::once_flag once;
  std::atomic<int> level{0};
  std::atomic<uint32_t> mask{0};
  FILE* out = stdout;
  std::mutex writeMutex;
  char host[64] = {};
};

State& state() {
  static State s;
  return s;
}

thread_local int tlsRank = -1;

uint32_t subsysBit(const std::string& name) {
  static const struct { const char* name; uint32_t bit; } table[] = {
      {"INIT", kInit}, {"COLL", kColl}, {"P2P", kP2p}, {"SHM", kShm}, {"NET", kNet},
      {"GRAPH", kGraph}, {"TUNING", kTuning}, {"ENV", kEnv}, {"ALLOC", kAlloc},
      {"CALL", kCall}, {"PROXY", kProxy}, {"BOOTSTRAP", kBootstrap}, {"ALL", kAll}};
  for (const auto& entry : table)
    if (strcasecmp(entry.name, name.c_str()) == 0) return entry.bit;
  return 0;
}

void configure(State& s) {
  std::string level;
  std::string subsys = "INIT,BOOTSTRAP,ENV";
  std::string file;
  try {
    level = params::kDebug.get();
    subsys = params::kDebugSubsys.get();
    file = params::kDebugFile.get();
  } catch (...) {
  }
  int lvl = 0;
  if (strcasecmp(level.c_str(), "VERSION") == 0) lvl = 1;
  else if (strcasecmp(level.c_str(), "WARN") == 0) lvl = 2;
  else if (strcasecmp(level.c_str(), "INFO") == 0) lvl = 3;
  else if (strcasecmp(level.c_str(), "TRACE") == 0) lvl = 4;
  s.level = lvl;

  bool invert = !subsys.empty() && subsys[0] == '^';
  if (invert) subsys.erase(0, 1);
  uint32_t mask = 0;
  size_t start = 0;
  while (start <= subsys.size()) {
    size_t comma = subsys.find(',', start);
    if (comma == std::string::npos) comma = subsys.size();
    mask |= subsysBit(subsys.substr(start, comma - start));
    start = comma + 1;
  }
  s.mask = invert ? ~mask : mask;

  gethostname(s.host, sizeof(s.host) - 1);
  if (char* dot = std::strchr(s.host, '.')) *dot = '\0';
  if (!file.empty()) {
    std::string path;
    for (size_t i = 0; i < file.size(); ++i) {
      if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'h') { path += s.host; ++i; }
      else if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'p') { path += std::to_string(getpid()); ++i; }
      else path += file[i];
    }
    if (FILE* f = std::fopen(path.c_str(), "w")) s.out = f;
  }
}

State& configured() {
  State& s = state();
  std::call_once(s.once, [&] { configure(s); });
  return s;
}

}  // namespace

bool enabled(Level level, uint32_t subsys) noexcept {
  State& s = configured();
  if (static_cast<int>(level) > s.level.load(std::memory_order_relaxed)) return false;
  return level <= Level::Warn || (s.mask.load(std::memory_order_relaxed) & subsys) != 0;
}

void write(Level level, uint32_t /*subsys*/, const char* fmt, ...) {
  State& s = configured();
  char message[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  const char* tag = level == Level::Warn ? "WARN" : level == Level::Trace ? "TRACE" : "INFO";
  std::lock_guard lock(s.writeMutex);
  if (tlsRank >= 0)
    std::fprintf(s.out, "%s:%d:%ld [%d] NCCL %s %s\n", s.host, getpid(), static_cast<long>(syscall(SYS_gettid)),
                 tlsRank, tag, message);
  else
    std::fprintf(s.out, "%s:%d:%ld NCCL %s %s\n", s.host, getpid(), static_cast<long>(syscall(SYS_gettid)), tag,
                 message);
  std::fflush(s.out);
}

void setThreadRank(int rank) noexcept { tlsRank = rank; }

void reload() noexcept { configure(state()); }

}  // namespace topoccl::log

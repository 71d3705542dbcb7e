#include "common/config.hpp"

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>

#include "common/error.hpp"

namespace topoccl::config {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<ParamInfo> params;
  std::map<std::string, std::optional<std::string>> overrides;
  bool filesLoaded = false;
  std::map<std::string, std::string> fromFiles;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

// KEY=VALUE lines; '#' starts a comment. Earlier files win, like NCCL.
void loadConfFile(const std::string& path, std::map<std::string, std::string>& into) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    auto trim = [](std::string s) {
      const auto b = s.find_first_not_of(" \t\r");
      const auto e = s.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    std::string key = trim(line.substr(0, eq));
    if (!key.empty()) into.emplace(key, trim(line.substr(eq + 1)));
  }
}

void loadFilesOnce(Registry& reg) {
  if (reg.filesLoaded) return;
  reg.filesLoaded = true;
  if (const char* path = std::getenv("NCCL_CONF_FILE")) loadConfFile(path, reg.fromFiles);
  if (const char* home = std::getenv("HOME")) loadConfFile(std::string(home) + "/.nccl.conf", reg.fromFiles);
  loadConfFile("/etc/nccl.conf", reg.fromFiles);
}

}  // namespace

std::optional<std::string> lookup(const std::string& name) {
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  if (auto it = reg.overrides.find(name); it != reg.overrides.end()) return it->second;
  if (const char* value = std::getenv(name.c_str())) return std::string(value);
  loadFilesOnce(reg);
  if (auto it = reg.fromFiles.find(name); it != reg.fromFiles.end()) return it->second;
  return std::nullopt;
}

const std::vector<ParamInfo>& allParams() { return registry().params; }

void registerParam(ParamInfo info) {
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.params.push_back(std::move(info));
}

void setOverride(const std::string& name, std::optional<std::string> value) {
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.overrides[name] = std::move(value);
}

void clearOverrides() {
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.overrides.clear();
}

int64_t parseInteger(const std::string& name, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 0);
  if (text.empty() || errno != 0 || (end && *end != '\0'))
    throwInvalidArgument(name + "='" + text + "' is not an integer");
  return value;
}

bool parseBoolean(const std::string& name, const std::string& text) {
  if (text == "1" || text == "true" || text == "TRUE" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "FALSE" || text == "no") return false;
  throwInvalidArgument(name + "='" + text + "' is not a boolean (use 0 or 1)");
}

}  // namespace topoccl::config

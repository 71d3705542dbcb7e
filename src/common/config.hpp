// One typed registry of every setting topoccl reads: each is declared once in params.hpp with its
// name (NCCL's where one exists), type, default and doc. Values come from, in order: a test
// override, the process environment, NCCL_CONF_FILE, ~/.nccl.conf, /etc/nccl.conf.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace topoccl::config {

enum class Kind { Integer, Boolean, Text };

struct ParamInfo {
  const char* name;
  Kind kind;
  std::string defaultText;
  const char* doc;
};

// Raw text of a setting, or nullopt when nobody set it.
std::optional<std::string> lookup(const std::string& name);
// Registry introspection, for `topoccl-info --params` and the docs.
const std::vector<ParamInfo>& allParams();
void registerParam(ParamInfo info);

// Test hooks: force a value (or unset it with nullopt) regardless of the environment.
void setOverride(const std::string& name, std::optional<std::string> value);
void clearOverrides();

int64_t parseInteger(const std::string& name, const std::string& text);  // throws naming `name`
bool parseBoolean(const std::string& name, const std::string& text);

template <class T>
class Param;

template <>
class Param<int64_t> {
 public:
  Param(const char* name, int64_t defaultValue, const char* doc) : name_(name), default_(defaultValue) {
    registerParam({name, Kind::Integer, std::to_string(defaultValue), doc});
  }
  int64_t get() const {
    auto text = lookup(name_);
    return text ? parseInteger(name_, *text) : default_;
  }
  const char* name() const { return name_; }

 private:
  const char* name_;
  int64_t default_;
};

template <>
class Param<bool> {
 public:
  Param(const char* name, bool defaultValue, const char* doc) : name_(name), default_(defaultValue) {
    registerParam({name, Kind::Boolean, defaultValue ? "1" : "0", doc});
  }
  bool get() const {
    auto text = lookup(name_);
    return text ? parseBoolean(name_, *text) : default_;
  }
  const char* name() const { return name_; }

 private:
  const char* name_;
  bool default_;
};

template <>
class Param<std::string> {
 public:
  Param(const char* name, const char* defaultValue, const char* doc) : name_(name), default_(defaultValue) {
    registerParam({name, Kind::Text, defaultValue, doc});
  }
  std::string get() const {
    auto text = lookup(name_);
    return text ? *text : default_;
  }
  bool isSet() const { return lookup(name_).has_value(); }
  const char* name() const { return name_; }

 private:
  const char* name_;
  std::string default_;
};

}  // namespace topoccl::config

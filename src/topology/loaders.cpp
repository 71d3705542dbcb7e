#include "topology/loaders.hpp"

#include <pugixml.hpp>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "common/params.hpp"

namespace topoccl::topo {

std::string readTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throwSystemError("topology: cannot open '" + path + "'");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throwSystemError("topology: cannot read '" + path + "'");
  return buffer.str();
}

void parseXmlOrThrow(pugi::xml_document& doc, const std::string& text, const std::string& sourceName) {
  const pugi::xml_parse_result parsed = doc.load_buffer(text.data(), text.size(), pugi::parse_default, pugi::encoding_utf8);
  if (!parsed)
    throwParseError(sourceName, lineOfOffset(text, static_cast<size_t>(parsed.offset)),
                    std::string("malformed XML: ") + parsed.description());
}

int lineOfOffset(const std::string& text, size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
}

void throwParseError(const std::string& sourceName, int line, const std::string& message) {
  throwInvalidArgument(sourceName + ":" + std::to_string(line) + ": " + message);
}

FileFormat detectFormat(const std::string& text, const std::string& sourceName) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throwParseError(sourceName, 1, "empty topology file");
  if (text[first] == '{') return FileFormat::Json;
  if (text.find("<topology") != std::string::npos) return FileFormat::HwlocXml;
  if (text.find("<system") != std::string::npos) return FileFormat::NcclXml;
  throwParseError(sourceName, lineOfOffset(text, first),
                  "not a topology file: expected NCCL XML (<system>), hwloc XML (<topology>) or topoccl JSON ({)");
}

Topology loadTopologyFile(const std::string& path) {
  std::string text = readTextFile(path);
  switch (detectFormat(text, path)) {
    case FileFormat::Json: return parseJson(text, path);
    case FileFormat::HwlocXml: return parseHwlocXml(text, path);
    case FileFormat::NcclXml: return parseNcclXml(text, path);
  }
  throwInternalError("topology: unknown format");
}

Topology loadNcclXml(const std::string& path) { return parseNcclXml(readTextFile(path), path); }
Topology loadHwlocXml(const std::string& path) { return parseHwlocXml(readTextFile(path), path); }
Topology loadJson(const std::string& path) { return parseJson(readTextFile(path), path); }

std::string topologyFileOverride() {
  if (params::kTopoFile.isSet()) return params::kTopoFile.get();
  return params::kNcclTopoFile.get();
}

}  // namespace topoccl::topo

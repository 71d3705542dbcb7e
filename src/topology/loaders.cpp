#include "topology/loaders.hpp"

#include <pugixml.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
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

namespace {

// Offset of the first byte that does not start a well-formed UTF-8 sequence (no overlongs, no
// surrogates, nothing past U+10FFFF), or npos. pugixml copies any bytes through, and names read from
// a file end up in JSON, whose writer requires UTF-8.
size_t firstInvalidUtf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (length == 0 || i + length > text.size()) return i;
    uint32_t cp = c & (0x7fu >> length);
    for (size_t k = 1; k < length; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3fu);
    }
    static constexpr uint32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinimum[length] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += length;
  }
  return std::string::npos;
}

}  // namespace

void parseXmlOrThrow(pugi::xml_document& doc, const std::string& text, const std::string& sourceName) {
  if (size_t bad = firstInvalidUtf8(text); bad != std::string::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[bad]));
    throwParseError(sourceName, lineOfOffset(text, bad), std::string("malformed XML: not UTF-8 (byte ") + byte + ")");
  }
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

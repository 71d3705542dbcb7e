// Every way to fill and save a Topology. Loaders throw topoccl::Error (ncclInvalidArgument for bad
// content, ncclSystemError for unreadable files) with a message naming the file and, where the
// content is at fault, the line.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace pugi {
class xml_document;
}

namespace topoccl::topo {

enum class FileFormat { NcclXml, HwlocXml, Json };

// NCCL topology XML (<system version="1|2">): full NCCL_TOPO_DUMP_FILE dumps and cloud skeletons.
Topology loadNcclXml(const std::string& path);
Topology parseNcclXml(const std::string& text, const std::string& sourceName);
std::string writeNcclXml(const Topology& topo);

// hwloc XML v2 (<topology version="2.0">), read with pugixml so it works without libhwloc.
Topology loadHwlocXml(const std::string& path);
Topology parseHwlocXml(const std::string& text, const std::string& sourceName);

// topoccl's own JSON format ("format": "topoccl-topology").
Topology loadJson(const std::string& path);
Topology parseJson(const std::string& text, const std::string& sourceName);
std::string writeJson(const Topology& topo);

// Sniffs the format from the content, then loads.
FileFormat detectFormat(const std::string& text, const std::string& sourceName);
Topology loadTopologyFile(const std::string& path);

// Built-in machines, written from published facts (see presets.cpp).
std::vector<std::string> presetNames();
Topology loadPreset(const std::string& name);

// TOPOCCL_TOPO_FILE, else NCCL_TOPO_FILE, when either is set: the file that overrides discovery.
std::string topologyFileOverride();

// Internal helpers shared by the loaders.
std::string readTextFile(const std::string& path);
int lineOfOffset(const std::string& text, size_t offset);  // 1-based
[[noreturn]] void throwParseError(const std::string& sourceName, int line, const std::string& message);
// Parses XML text into `doc`; malformed input throws with the source name and line.
void parseXmlOrThrow(pugi::xml_document& doc, const std::string& text, const std::string& sourceName);

}  // namespace topoccl::topo

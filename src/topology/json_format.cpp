// topoccl's own topology format: JSON with every vertex and link spelled out, for hand-written
// machines, presets and golden dumps. Unknown keys are errors, so typos do not pass silently.
#include <nlohmann/json.hpp>

#include <limits>
#include <optional>
#include <set>
#include <string>

#include "common/error.hpp"
#include "common/json_integer.hpp"
#include "topology/loaders.hpp"

namespace topoccl::topo {

namespace {

using nlohmann::json;
constexpr const char* kFormatTag = "topoccl-topology";

class JsonReader {
 public:
  JsonReader(const std::string& text, const std::string& sourceName) : text_(text), source_(sourceName) {}

  Topology read() {
    json doc;
    try {
      doc = json::parse(text_);
    } catch (const json::parse_error& e) {
      throwParseError(source_, lineOfOffset(text_, e.byte > 0 ? e.byte - 1 : 0), std::string("malformed JSON: ") + e.what());
    } catch (const json::exception& e) {
      // e.g. a number too large for a double: nlohmann gives no offset, but quotes the token.
      const std::string what = e.what();
      size_t at = 0;
      if (size_t q = what.find("parsing '"); q != std::string::npos) {
        const std::string token = what.substr(q + 9, what.find('\'', q + 9) - (q + 9));
        if (size_t found = text_.find(token); !token.empty() && found != std::string::npos) at = found;
      }
      throwParseError(source_, lineOfOffset(text_, at), "malformed JSON: " + what);
    }
    try {
      return build(doc);
    } catch (const json::exception& e) {
      fail("invalid topology: " + std::string(e.what()));
    }
  }

 private:
  const std::string& text_;
  const std::string& source_;
  std::string where_ = "top level";

  // nlohmann keeps no positions, so content errors name the element instead of a line.
  [[noreturn]] void fail(const std::string& message) { throwInvalidArgument(source_ + ": " + where_ + ": " + message); }

  // An optional integer field, range-checked (a float or an out-of-range number is an error naming the key).
  template <class T>
  T integer(const json& object, const char* key, T fallback) {
    if (!object.contains(key)) return fallback;
    const std::optional<T> value = jsonInteger<T>(object.at(key));
    if (!value)
      fail(std::string("'") + key + "' must be an integer from " + std::to_string(std::numeric_limits<T>::min()) + " to " +
           std::to_string(std::numeric_limits<T>::max()) + ", not " + object.at(key).dump());
    return *value;
  }

  void onlyKeys(const json& object, std::initializer_list<const char*> allowed) {
    if (!object.is_object()) fail("expected an object");
    std::set<std::string> ok(allowed.begin(), allowed.end());
    for (const auto& [key, value] : object.items())
      if (!ok.count(key)) fail("unknown key '" + key + "'");
  }

  Topology build(const json& doc) {
    onlyKeys(doc, {"format", "version", "name", "source", "vertices", "links"});
    if (doc.value("format", "") != kFormatTag) fail(std::string("\"format\" must be \"") + kFormatTag + "\"");
    if (integer<int>(doc, "version", 0) != 1) fail("unsupported version (expected 1)");
    Topology topo;
    topo.name = doc.value("name", "");
    topo.source = source_;
    int index = 0;
    for (const json& jv : doc.at("vertices")) {
      where_ = "vertices[" + std::to_string(index++) + "]";
      onlyKeys(jv, {"name", "kind", "host", "busId", "pciClass", "pciVendor", "pciDevice", "numa", "affinity", "arch",
                    "vendor", "family", "model", "gpuIndex", "sm", "gpuModel", "netName", "speedGbps", "linkLayer",
                    "gpuDirect", "physicalSwitches"});
      Vertex v;
      auto kind = vertexKindFromName(jv.at("kind").get<std::string>());
      if (!kind) fail("unknown kind '" + jv.at("kind").get<std::string>() + "'");
      v.kind = *kind;
      v.name = jv.at("name").get<std::string>();
      if (topo.findByName(v.name)) fail("duplicate vertex name '" + v.name + "'");
      v.host = integer<int>(jv, "host", 0);
      v.busId = jv.value("busId", "");
      v.pciClass = integer<uint32_t>(jv, "pciClass", 0u);
      v.pciVendor = integer<uint16_t>(jv, "pciVendor", uint16_t{0});
      v.pciDevice = integer<uint16_t>(jv, "pciDevice", uint16_t{0});
      v.numaId = integer<int>(jv, "numa", -1);
      v.cpuAffinity = jv.value("affinity", "");
      v.arch = jv.value("arch", "");
      v.cpuVendor = jv.value("vendor", "");
      v.cpuFamily = integer<int>(jv, "family", 0);
      v.cpuModel = integer<int>(jv, "model", 0);
      v.gpuIndex = integer<int>(jv, "gpuIndex", -1);
      v.sm = integer<int>(jv, "sm", 0);
      v.gpuModel = jv.value("gpuModel", "");
      v.netName = jv.value("netName", "");
      v.speedGbps = jv.value("speedGbps", 0.0);
      auto layer = linkLayerFromName(jv.value("linkLayer", "unknown"));
      if (!layer) fail("unknown linkLayer");
      v.linkLayer = *layer;
      v.gpuDirect = jv.value("gpuDirect", false);
      v.physicalSwitches = integer<int>(jv, "physicalSwitches", 0);
      topo.addVertex(v);
    }
    index = 0;
    for (const json& jl : doc.at("links")) {
      where_ = "links[" + std::to_string(index++) + "]";
      onlyKeys(jl, {"from", "to", "kind", "bandwidthGBs", "latencyUs", "nvlinkCount", "nvlinkGeneration", "pcieGen", "pcieWidth"});
      auto endpoint = [&](const char* key) {
        auto id = topo.findByName(jl.at(key).get<std::string>());
        if (!id) fail(std::string(key) + " names unknown vertex '" + jl.at(key).get<std::string>() + "'");
        return *id;
      };
      auto kind = linkKindFromName(jl.at("kind").get<std::string>());
      if (!kind) fail("unknown link kind '" + jl.at("kind").get<std::string>() + "'");
      // Per-direction numbers: a scalar means both directions, [forward, backward] otherwise.
      auto pairOf = [&](const char* key) -> std::pair<double, double> {
        if (!jl.contains(key)) return {0, 0};
        const json& value = jl.at(key);
        if (value.is_array()) {
          if (value.size() != 2) fail(std::string(key) + " must be a number or [forward, backward]");
          return {value[0].get<double>(), value[1].get<double>()};
        }
        return {value.get<double>(), value.get<double>()};
      };
      auto [bwForward, bwBackward] = pairOf("bandwidthGBs");
      auto [latForward, latBackward] = pairOf("latencyUs");
      Link l{.kind = *kind, .nvlinkCount = integer<int>(jl, "nvlinkCount", 0), .nvlinkGeneration = integer<int>(jl, "nvlinkGeneration", 0),
             .pcieGen = integer<int>(jl, "pcieGen", 0), .pcieWidth = integer<int>(jl, "pcieWidth", 0)};
      VertexId a = endpoint("from"), b = endpoint("to");
      if (a == b) fail("a link needs two different vertices");
      if (l.pcieWidth < 0 || l.pcieWidth > 32) fail("pcieWidth " + std::to_string(l.pcieWidth) + " is not a PCIe width (0..32 lanes)");
      if (bwForward <= 0 && l.kind == LinkKind::Pcie) bwForward = bwBackward = pcieBandwidthGBs(l.pcieGen, l.pcieWidth);
      if (bwForward <= 0 && l.kind == LinkKind::NvLink)
        bwForward = bwBackward = std::max(1, l.nvlinkCount) * nvlinkBandwidthPerLinkGBs(topo.vertex(a).sm);
      if (bwForward <= 0 || bwBackward <= 0) fail("bandwidthGBs must be positive");
      if (topo.linkBetween(a, b)) fail("duplicate link");
      Link forward = l, backward = l;
      forward.from = a, forward.to = b, forward.bandwidthGBs = bwForward, forward.latencyUs = latForward;
      backward.from = b, backward.to = a, backward.bandwidthGBs = bwBackward, backward.latencyUs = latBackward;
      topo.addDirectedLink(forward);
      topo.addDirectedLink(backward);
    }
    where_ = "top level";
    topo.assignGpuIndices();
    return topo;
  }
};

}  // namespace

Topology parseJson(const std::string& text, const std::string& sourceName) { return JsonReader(text, sourceName).read(); }

std::string writeJson(const Topology& topo) {
  json doc = {{"format", kFormatTag}, {"version", 1}, {"name", topo.name}};
  json vertices = json::array();
  for (const Vertex& v : topo.vertices()) {
    json jv = {{"name", v.name}, {"kind", vertexKindName(v.kind)}, {"host", v.host}};
    if (!v.busId.empty()) jv["busId"] = v.busId;
    if (v.pciClass) jv["pciClass"] = v.pciClass;
    if (v.pciVendor) jv["pciVendor"] = v.pciVendor;
    if (v.pciDevice) jv["pciDevice"] = v.pciDevice;
    if (v.kind == VertexKind::Cpu) {
      jv["numa"] = v.numaId;
      jv["affinity"] = v.cpuAffinity;
      jv["arch"] = v.arch;
      jv["vendor"] = v.cpuVendor;
      jv["family"] = v.cpuFamily;
      jv["model"] = v.cpuModel;
    }
    if (v.kind == VertexKind::Gpu) {
      jv["gpuIndex"] = v.gpuIndex;
      jv["sm"] = v.sm;
      if (!v.gpuModel.empty()) jv["gpuModel"] = v.gpuModel;
    }
    if (v.kind == VertexKind::Nic) {
      jv["netName"] = v.netName;
      jv["speedGbps"] = v.speedGbps;
      jv["linkLayer"] = linkLayerName(v.linkLayer);
      jv["gpuDirect"] = v.gpuDirect;
    }
    if (v.kind == VertexKind::NvSwitch) jv["physicalSwitches"] = v.physicalSwitches;
    vertices.push_back(jv);
  }
  json links = json::array();
  for (const Link& l : topo.links()) {
    if (l.from > l.to) continue;  // each pair once, carrying both directions
    const Link* back = topo.linkBetween(l.to, l.from);
    json jl = {{"from", topo.vertex(l.from).name}, {"to", topo.vertex(l.to).name}, {"kind", linkKindName(l.kind)}};
    auto both = [&](double forward, double backward) { return forward == backward ? json(forward) : json::array({forward, backward}); };
    jl["bandwidthGBs"] = both(l.bandwidthGBs, back ? back->bandwidthGBs : l.bandwidthGBs);
    jl["latencyUs"] = both(l.latencyUs, back ? back->latencyUs : l.latencyUs);
    if (l.kind == LinkKind::NvLink) {
      jl["nvlinkCount"] = l.nvlinkCount;
      jl["nvlinkGeneration"] = l.nvlinkGeneration;
    }
    if (l.kind == LinkKind::Pcie) {
      jl["pcieGen"] = l.pcieGen;
      jl["pcieWidth"] = l.pcieWidth;
    }
    links.push_back(jl);
  }
  doc["vertices"] = vertices;
  doc["links"] = links;
  // Strings from other sources than the loaders (live discovery) may not be UTF-8: never throw for it.
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace topoccl::topo

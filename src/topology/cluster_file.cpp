#include "topology/cluster_file.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.hpp"
#include "common/json_integer.hpp"
#include "topology/loaders.hpp"

namespace topoccl::topo {

namespace {

using nlohmann::json;

class ClusterReader {
 public:
  ClusterReader(const std::string& text, const std::string& source) : text_(text), source_(source) {}

  ClusterFile read() {
    json doc;
    try {
      doc = json::parse(text_);
    } catch (const json::exception& e) {
      const size_t byte = e.id == 101 ? static_cast<const json::parse_error&>(e).byte : 0;
      throwParseError(source_, lineOfOffset(text_, byte > 0 ? byte - 1 : 0), std::string("malformed JSON: ") + e.what());
    }
    try {
      return build(doc);
    } catch (const json::exception& e) {
      fail(std::string("invalid cluster file: ") + e.what());
    }
  }

 private:
  const std::string& text_;
  const std::string& source_;
  std::string where_ = "top level";

  [[noreturn]] void fail(const std::string& message) const {
    throwInvalidArgument(source_ + ": " + where_ + ": " + message);
  }
  void onlyKeys(const json& object, std::initializer_list<const char*> allowed) {
    if (!object.is_object()) fail("expected an object");
    const std::set<std::string> ok(allowed.begin(), allowed.end());
    for (const auto& [key, value] : object.items())
      if (!ok.count(key)) fail("unknown key '" + key + "'");
  }
  const json& required(const json& object, const char* key) {
    if (!object.contains(key)) fail(std::string("missing '") + key + "'");
    return object.at(key);
  }
  int integer(const json& value, const char* what) {
    const std::optional<int> i = jsonInteger<int>(value);
    if (!i) fail(std::string("'") + what + "' must be an integer, not " + value.dump());
    return *i;
  }

  ClusterFile build(const json& doc) {
    onlyKeys(doc, {"format", "version", "name", "hosts"});
    if (required(doc, "format") != "topoccl-cluster") fail("'format' must be \"topoccl-cluster\"");
    if (required(doc, "version") != 1) fail("unsupported 'version' (this build reads 1)");
    ClusterFile file;
    file.source = source_;
    file.name = doc.value("name", std::string());
    const json& hosts = required(doc, "hosts");
    if (!hosts.is_array() || hosts.empty()) fail("'hosts' must be a non-empty array");
    std::set<std::string> hostNames, addresses;
    for (size_t h = 0; h < hosts.size(); ++h) {
      where_ = "hosts[" + std::to_string(h) + "]";
      const json& entry = hosts[h];
      onlyKeys(entry, {"name", "ranks", "nics"});
      ClusterHost host;
      host.name = required(entry, "name").get<std::string>();
      if (host.name.empty() || !hostNames.insert(host.name).second) fail("empty or repeated host name '" + host.name + "'");
      host.ranks = integer(required(entry, "ranks"), "ranks");
      if (host.ranks < 1) fail("'ranks' must be >= 1, got " + std::to_string(host.ranks));
      const json& nics = required(entry, "nics");
      if (!nics.is_array() || nics.empty()) fail("'nics' must be a non-empty array");
      std::set<std::string> nicNames;
      for (size_t n = 0; n < nics.size(); ++n) {
        where_ = "hosts[" + std::to_string(h) + "] (" + host.name + ") nics[" + std::to_string(n) + "]";
        const json& nicEntry = nics[n];
        onlyKeys(nicEntry, {"name", "address", "gbps", "rail", "near_ranks", "alpha_us", "goodput_gbps"});
        ClusterNic nic;
        nic.name = required(nicEntry, "name").get<std::string>();
        if (nic.name.empty() || !nicNames.insert(nic.name).second) fail("empty or repeated interface name '" + nic.name + "'");
        nic.address = required(nicEntry, "address").get<std::string>();
        unsigned char raw[16];
        if (inet_pton(AF_INET, nic.address.c_str(), raw) != 1 && inet_pton(AF_INET6, nic.address.c_str(), raw) != 1)
          fail("'address' " + nic.address + " is not an IPv4 or IPv6 address");
        if (!addresses.insert(nic.address).second) fail("address " + nic.address + " appears twice in the file");
        nic.gbps = required(nicEntry, "gbps").get<double>();
        if (!(nic.gbps > 0)) fail("'gbps' must be > 0");
        nic.alphaUs = nicEntry.value("alpha_us", 0.0);
        nic.goodputGbps = nicEntry.value("goodput_gbps", 0.0);
        if (nic.alphaUs < 0 || nic.goodputGbps < 0) fail("'alpha_us' and 'goodput_gbps' must be >= 0");
        nic.rail = nicEntry.contains("rail") ? integer(nicEntry.at("rail"), "rail") : static_cast<int>(n);
        if (nic.rail < 0) fail("'rail' must be >= 0");
        for (const json& r : nicEntry.value("near_ranks", json::array())) {
          const int local = integer(r, "near_ranks");
          if (local < 0 || local >= host.ranks)
            fail("near_ranks holds " + std::to_string(local) + ", outside the host's ranks 0.." + std::to_string(host.ranks - 1));
          nic.nearRanks.push_back(local);
        }
        host.nics.push_back(std::move(nic));
      }
      file.hosts.push_back(std::move(host));
    }
    return file;
  }
};

}  // namespace

const ClusterHost* ClusterFile::hostWithAddress(const std::string& address) const {
  for (const ClusterHost& host : hosts)
    for (const ClusterNic& nic : host.nics)
      if (nic.address == address) return &host;
  return nullptr;
}

ClusterFile parseClusterFile(const std::string& text, const std::string& sourceName) {
  return ClusterReader(text, sourceName).read();
}

ClusterFile loadClusterFile(const std::string& path) { return parseClusterFile(readTextFile(path), path); }

double networkLinkLatencyUs(const ClusterFile& file) {
  double alpha = 0;
  for (const ClusterHost& host : file.hosts)
    for (const ClusterNic& nic : host.nics) alpha = std::max(alpha, nic.alphaUs);
  return alpha / 2;
}

namespace {

// Bus ids order NICs into rails when hosts are fused (see cluster.hpp), so they follow the rail.
VertexId addNic(Topology& t, size_t index, const std::string& netName, double gbps, int rail) {
  char bus[32];
  std::snprintf(bus, sizeof(bus), "0000:%02x:00.0", 0x10 + rail);
  return t.addVertex(Vertex{.kind = VertexKind::Nic, .name = "nic" + std::to_string(index), .busId = bus,
                            .netName = netName, .speedGbps = gbps, .linkLayer = LinkLayer::Ethernet});
}

double speedOf(const ClusterNic& nic) { return nic.goodputGbps > 0 ? nic.goodputGbps : nic.gbps; }

}  // namespace

Topology hostTopology(const ClusterHost& host, bool bundled, bool perRankCpus) {
  Topology t;
  t.name = host.name;
  t.source = "cluster file host " + host.name;
  const VertexId cpu = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu0", .numaId = 0});
  if (bundled && host.nics.size() > 1) {
    std::string names;
    double gbps = 0;
    for (const ClusterNic& nic : host.nics) {
      names += (names.empty() ? "" : "+") + nic.name;
      gbps += speedOf(nic);
    }
    t.addLink(cpu, addNic(t, 0, names, gbps, 0), Link{.kind = LinkKind::Pcie});
    return t;
  }
  std::vector<VertexId> cpus{cpu};
  if (perRankCpus) {
    for (int l = 1; l < host.ranks; ++l)
      cpus.push_back(t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu" + std::to_string(l), .numaId = l}));
    for (size_t a = 0; a < cpus.size(); ++a)
      for (size_t b = a + 1; b < cpus.size(); ++b)  // ranks of one host meet in memory: one thread's memcpy
        t.addLink(cpus[a], cpus[b], Link{.kind = LinkKind::CpuInterconnect, .bandwidthGBs = 10.0});
  }
  for (size_t n = 0; n < host.nics.size(); ++n) {
    const ClusterNic& nic = host.nics[n];
    const VertexId id = addNic(t, n, nic.name, speedOf(nic), nic.rail);
    if (!perRankCpus || nic.nearRanks.empty()) t.addLink(cpu, id, Link{.kind = LinkKind::Pcie});
    else
      for (int l : nic.nearRanks) t.addLink(cpus[static_cast<size_t>(l)], id, Link{.kind = LinkKind::Pcie});
  }
  return t;
}

}  // namespace topoccl::topo

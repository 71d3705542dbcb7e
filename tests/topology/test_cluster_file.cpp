// The cluster file (TOPOCCL_CLUSTER_FILE): parsing, its errors, and the host graphs built from it.
#include <catch2/catch.hpp>

#include <string>

#include "common/error.hpp"
#include "topology/cluster.hpp"
#include "topology/cluster_file.hpp"

using namespace topoccl;
using namespace topoccl::topo;

namespace {

const std::string kTwoByTwo = R"({
  "format": "topoccl-cluster", "version": 1, "name": "rig",
  "hosts": [
    {"name": "h0", "ranks": 2, "nics": [
      {"name": "eth0", "address": "10.79.1.1", "gbps": 2, "rail": 0, "near_ranks": [0]},
      {"name": "eth1", "address": "10.79.2.1", "gbps": 0.5, "rail": 1, "near_ranks": [1]}]},
    {"name": "h1", "ranks": 2, "nics": [
      {"name": "eth0", "address": "10.79.1.2", "gbps": 2, "rail": 0, "near_ranks": [0]},
      {"name": "eth1", "address": "10.79.2.2", "gbps": 0.5, "rail": 1}]}
  ]
})";

std::string errorOf(const std::string& text) {
  try {
    parseClusterFile(text, "c.json");
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    return e.what();
  }
  return "(no error)";
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("cluster file: hosts, NICs, speeds, rails and nearest ranks are read") {
  const ClusterFile file = parseClusterFile(kTwoByTwo, "c.json");
  CHECK(file.name == "rig");
  REQUIRE(file.hosts.size() == 2);
  CHECK(file.hosts[1].name == "h1");
  CHECK(file.hosts[0].ranks == 2);
  REQUIRE(file.hosts[0].nics.size() == 2);
  CHECK(file.hosts[0].nics[1].gbps == 0.5);
  CHECK(file.hosts[0].nics[1].rail == 1);
  CHECK(file.hosts[0].nics[1].nearRanks == std::vector<int>{1});
  CHECK(file.hosts[1].nics[1].nearRanks.empty());
  CHECK(file.hostWithAddress("10.79.2.2") == &file.hosts[1]);
  CHECK(file.hostWithAddress("10.79.9.9") == nullptr);
}

TEST_CASE("cluster file: hosts become graphs whose fused cluster has each NIC on its rail at its speed") {
  const ClusterFile file = parseClusterFile(kTwoByTwo, "c.json");
  std::vector<HostReport> reports;
  for (const ClusterHost& host : file.hosts) reports.push_back({host.name, hostTopology(host)});
  const Topology cluster = fuseHosts(reports, FuseOptions{});
  CHECK(cluster.count(VertexKind::Nic) == 4);
  int slowNics = 0;
  for (VertexId nic : cluster.nics()) {
    const Vertex& v = cluster.vertex(nic);
    CHECK((v.netName == "eth0" || v.netName == "eth1"));
    if (v.netName == "eth1") {
      CHECK(v.speedGbps == 0.5);
      ++slowNics;
    }
  }
  CHECK(slowNics == 2);
  CHECK(cluster.findByName("rail1").has_value());
}

TEST_CASE("cluster file: malformed or inconsistent files are rejected, naming the line or the element") {
  CHECK_THAT(errorOf("{\n  \"format\": \"topoccl-cluster\",\n  \"hosts\": [ }"), Catch::Contains("c.json:3"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "\"gbps\": 0.5, \"rail\": 1, \"near_ranks\": [1]", "\"gbps\": 0.5, \"rial\": 1")),
             Catch::Contains("h0") && Catch::Contains("nics[1]") && Catch::Contains("unknown key 'rial'"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "10.79.1.2", "10.79.1.1")), Catch::Contains("appears twice"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "\"near_ranks\": [1]", "\"near_ranks\": [2]")),
             Catch::Contains("near_ranks holds 2") && Catch::Contains("0..1"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "10.79.2.1", "10.79.2.999")), Catch::Contains("not an IPv4"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "\"gbps\": 2, \"rail\": 0, \"near_ranks\": [0]}", "\"rail\": 0}")),
             Catch::Contains("missing 'gbps'"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "\"ranks\": 2", "\"ranks\": 0")), Catch::Contains("'ranks' must be >= 1"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "topoccl-cluster", "topoccl-topology")), Catch::Contains("'format'"));
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "\"name\": \"h1\"", "\"name\": \"h0\"")), Catch::Contains("repeated host name"));
}

TEST_CASE("cluster file: fitted alpha and goodput are read, and bundled hosts present one NIC of the summed speed") {
  const std::string fitted = replaced(replaced(kTwoByTwo, "\"gbps\": 0.5, \"rail\": 1, \"near_ranks\": [1]}",
                                               "\"gbps\": 0.5, \"rail\": 1, \"alpha_us\": 12, \"goodput_gbps\": 0.47}"),
                                      "\"gbps\": 2, \"rail\": 0, \"near_ranks\": [0]}",
                                      "\"gbps\": 2, \"rail\": 0, \"alpha_us\": 30, \"goodput_gbps\": 1.9}");
  const ClusterFile file = parseClusterFile(fitted, "c.json");
  CHECK(file.hosts[0].nics[0].goodputGbps == 1.9);
  CHECK(file.hosts[0].nics[1].alphaUs == 12);
  CHECK(networkLinkLatencyUs(file) == 15);  // half the largest: a route crosses two network links
  const Topology separate = hostTopology(file.hosts[0]);
  REQUIRE(separate.nics().size() == 2);
  CHECK(separate.vertex(separate.nics()[0]).speedGbps == 1.9);  // fitted goodput, not the line rate
  const Topology bundled = hostTopology(file.hosts[0], true);
  REQUIRE(bundled.nics().size() == 1);
  CHECK(bundled.vertex(bundled.nics()[0]).speedGbps == Approx(2.37));
  CHECK(bundled.vertex(bundled.nics()[0]).netName == "eth0+eth1");
  CHECK_THAT(errorOf(replaced(kTwoByTwo, "\"rail\": 1, \"near_ranks\": [1]}", "\"rail\": 1, \"alpha_us\": -1}")),
             Catch::Contains(">= 0"));
}

TEST_CASE("cluster file: with a CPU per local rank, each rank's path to another host leaves through its nearest NIC") {
  const ClusterFile file = parseClusterFile(kTwoByTwo, "c.json");
  std::vector<HostReport> reports;
  for (const ClusterHost& host : file.hosts) reports.push_back({host.name, hostTopology(host, false, true)});
  const Topology cluster = fuseHosts(reports, FuseOptions{});
  CHECK(cluster.count(VertexKind::Cpu) == 4);
  for (int local : {0, 1}) {
    const std::string cpu = "cpu" + std::to_string(local);
    const Path path = cluster.path(*cluster.findByName("h0/" + cpu), *cluster.findByName("h1/" + cpu));
    REQUIRE(path.exists());
    std::vector<std::string> nics;
    for (VertexId v : path.vertices)
      if (cluster.vertex(v).kind == VertexKind::Nic) nics.push_back(cluster.vertex(v).netName);
    INFO("local rank " << local);
    CHECK(nics == std::vector<std::string>(2, local == 0 ? "eth0" : "eth1"));
  }
}

// The cluster graph a communicator fuses at creation: ranks are fork()ed processes posing as two
// hosts (NCCL_HOSTID), each host described by a different real topology file (TOPOCCL_TOPO_FILE).
// Every rank must hold the same graph, and know which host each rank is on.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/communicator.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;

namespace {

std::string dataFile(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/../data/" + name;
}

struct RankView {
  int status = -1;           // the child's exit status: 0 when its own checks passed
  std::string fingerprint;   // "" when the rank has no cluster graph
  std::string hostsOfRanks;  // clusterHost(r) for every r, comma separated
  int gpus = -1, nics = -1;
};

// Runs `nranks` processes; rank r takes the environment envOf(r). Each reports what its communicator saw.
std::vector<RankView> runProcesses(int nranks, const std::function<std::map<std::string, std::string>(int)>& envOf) {
  const bootstrap::UniqueId id = bootstrap::createUniqueId();
  std::vector<pid_t> pids;
  std::vector<int> readEnds;
  for (int r = 0; r < nranks; ++r) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      int code = 0;
      std::string line;
      try {
        for (const auto& [key, value] : envOf(r)) setenv(key.c_str(), value.c_str(), 1);
        auto comm = core::Communicator::create(id, nranks, r, core::CommOptions{});
        const topo::Topology* cluster = comm->clusterTopology();
        std::string hosts;
        for (int p = 0; p < nranks; ++p) hosts += (p ? "," : "") + std::to_string(comm->clusterHost(p));
        line = (cluster ? cluster->fingerprint() : std::string("-")) + " " + hosts + " " +
               std::to_string(cluster ? cluster->count(topo::VertexKind::Gpu) : -1) + " " +
               std::to_string(cluster ? cluster->count(topo::VertexKind::Nic) : -1) + "\n";
        comm->finalize();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 3;
      }
      if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) code = 4;
      close(fds[1]);
      _exit(code);
    }
    close(fds[1]);
    REQUIRE(pid > 0);
    pids.push_back(pid);
    readEnds.push_back(fds[0]);
  }
  std::vector<RankView> views(nranks);
  for (int r = 0; r < nranks; ++r) {
    std::string text;
    char buffer[512];
    for (ssize_t n; (n = read(readEnds[r], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
    close(readEnds[r]);
    int status = 0;
    waitpid(pids[r], &status, 0);
    views[r].status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char fingerprint[64] = {}, hosts[256] = {};
    if (std::sscanf(text.c_str(), "%63s %255s %d %d", fingerprint, hosts, &views[r].gpus, &views[r].nics) == 4) {
      views[r].fingerprint = fingerprint;
      views[r].hostsOfRanks = hosts;
    }
  }
  return views;
}

}  // namespace

TEST_CASE("cluster topology: two hosts with different machines fuse into one graph, the same on every rank",
          "[cluster-topology]") {
  // Ranks 0 and 2 on "node-b" (Azure NDv4 file: 8 GPUs, 8 NICs), ranks 1, 3 and 4 on "node-a" (NDv2: 8 GPUs,
  // 1 NIC). Hosts are numbered in identity order, so node-a is host 0 although rank 0 is on node-b.
  const int nranks = 5;
  auto envOf = [&](int r) -> std::map<std::string, std::string> {
    const bool onB = r == 0 || r == 2;
    return {{"NCCL_HOSTID", onB ? "node-b" : "node-a"},
            {"TOPOCCL_TOPO_FILE", dataFile(onB ? "nccl_azure-ndv4-topo.xml" : "nccl_azure-ndv2-topo.xml")},
            {"NCCL_TOPO_FILE", ""}};
  };
  const std::vector<RankView> views = runProcesses(nranks, envOf);

  const topo::Topology ndv4 = topo::loadTopologyFile(dataFile("nccl_azure-ndv4-topo.xml"));
  const topo::Topology ndv2 = topo::loadTopologyFile(dataFile("nccl_azure-ndv2-topo.xml"));
  for (int r = 0; r < nranks; ++r) {
    INFO("rank " << r);
    CHECK(views[r].status == 0);
    CHECK(views[r].fingerprint == views[0].fingerprint);
    CHECK(views[r].fingerprint != "-");
    CHECK(views[r].hostsOfRanks == "1,0,1,0,0");
    CHECK(views[r].gpus == ndv4.count(topo::VertexKind::Gpu) + ndv2.count(topo::VertexKind::Gpu));
    CHECK(views[r].nics == ndv4.count(topo::VertexKind::Nic) + ndv2.count(topo::VertexKind::Nic));
  }
}

TEST_CASE("cluster topology: TOPOCCL_TOPO_FUSE=0 gives no cluster graph, and a host without a NIC only a warning",
          "[cluster-topology]") {
  SECTION("disabled") {
    const auto views = runProcesses(2, [](int r) -> std::map<std::string, std::string> {
      return {{"TOPOCCL_TOPO_FUSE", "0"}, {"NCCL_HOSTID", r ? "a" : "b"}};
    });
    for (const RankView& v : views) {
      CHECK(v.status == 0);
      CHECK(v.fingerprint == "-");
      CHECK(v.hostsOfRanks == "-1,-1");
    }
  }
  SECTION("a host that has no NIC cannot join a cluster graph, but the communicator still works") {
    // The POWER8 Minsky hwloc file has GPUs and no NIC: fusion refuses it on every rank alike.
    const auto views = runProcesses(3, [](int r) -> std::map<std::string, std::string> {
      return {{"NCCL_HOSTID", r == 1 ? "nicless" : "other"},
              {"TOPOCCL_TOPO_FILE", dataFile(r == 1 ? "hwloc-v2_power8-minsky-4p100.xml" : "nccl_azure-ndv2-topo.xml")}};
    });
    for (const RankView& v : views) {
      CHECK(v.status == 0);
      CHECK(v.fingerprint == "-");
    }
  }
}

namespace {

std::string writeClusterFile(const std::string& nicName, const std::string& address) {
  char path[] = "/tmp/topoccl-cluster-file-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string text = R"({"format": "topoccl-cluster", "version": 1, "hosts": [
    {"name": "x", "ranks": 2, "nics": [{"name": ")" + nicName + R"(", "address": ")" + address +
                           R"(", "gbps": 4, "rail": 0}]}]})";
  REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  close(fd);
  return path;
}

std::string creationError(const std::string& clusterFile) {
  setenv("TOPOCCL_CLUSTER_FILE", clusterFile.c_str(), 1);
  std::string message = "(created)";
  try {
    core::Communicator::create(bootstrap::createUniqueId(), 1, 0, core::CommOptions{})->finalize();
  } catch (const std::exception& e) {
    message = e.what();
  }
  unsetenv("TOPOCCL_CLUSTER_FILE");
  return message;
}

}  // namespace

TEST_CASE("cluster file: the host's NICs come from it, and a file that disagrees with the machine is refused",
          "[cluster-topology]") {
  const std::string good = writeClusterFile("lo", "127.0.0.1");
  const std::string wrongAddress = writeClusterFile("lo", "10.254.254.254");
  const std::string wrongName = writeClusterFile("eth9", "127.0.0.1");
  CHECK_THAT(creationError(wrongAddress), Catch::Contains("TOPOCCL_CLUSTER_FILE=" + wrongAddress) &&
                                              Catch::Contains("no host in the file has an address of this machine"));
  CHECK_THAT(creationError(wrongName), Catch::Contains("NIC eth9") && Catch::Contains("127.0.0.1 is on interface lo here"));
  CHECK(creationError(good) == "(created)");
  // Two ranks posing as two hosts, each described by the file's host: the fused graph has its NIC on each.
  const auto views = runProcesses(2, [&](int r) -> std::map<std::string, std::string> {
    return {{"TOPOCCL_CLUSTER_FILE", good}, {"NCCL_HOSTID", r ? "a" : "b"}};
  });
  for (const RankView& v : views) {
    CHECK(v.status == 0);
    CHECK(v.nics == 2);
    CHECK(v.fingerprint == views[0].fingerprint);
  }
  for (const auto& path : {good, wrongAddress, wrongName}) std::remove(path.c_str());
}

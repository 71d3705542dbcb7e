// The cluster file (JSON, "format": "topoccl-cluster"): what a multi-host job runs on, written by hand or by
// tests/cluster/cluster.sh. Per host: its name, how many ranks it runs, and its NICs with address, speed,
// rail (NICs of one rail share a network) and the local ranks that sit nearest each (as a GPU sits under
// the PCIe switch of its NIC). TOPOCCL_CLUSTER_FILE hands it to every rank; each rank checks that its own
// host has the interfaces and addresses the file claims.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace topoccl::topo {

struct ClusterNic {
  std::string name;     // interface, "eth0"
  std::string address;  // IP, "10.79.1.1"
  double gbps = 0;      // line rate in Gbit/s
  int rail = 0;
  std::vector<int> nearRanks;  // local rank indices on the host
  // Fitted by a calibration run (tests/cluster/cluster.sh calibrate), 0 when not measured: one message's
  // fixed cost between two hosts over this NIC, and the TCP goodput it reached.
  double alphaUs = 0;
  double goodputGbps = 0;
};

struct ClusterHost {
  std::string name;
  int ranks = 0;
  std::vector<ClusterNic> nics;
};

struct ClusterFile {
  std::string name;
  std::string source;
  std::vector<ClusterHost> hosts;
  // The host whose NIC addresses include `address`, or nullptr.
  const ClusterHost* hostWithAddress(const std::string& address) const;
};

// Throws ncclInvalidArgument naming the file and the line (malformed JSON) or the element (bad content:
// unknown keys, missing fields, duplicate addresses, near_ranks out of range, ...).
ClusterFile parseClusterFile(const std::string& text, const std::string& sourceName);
ClusterFile loadClusterFile(const std::string& path);

// One host of the file as a graph: a CPU and its NICs (named by interface; speed: the fitted goodput, else
// the line rate), so the cluster graph, the simulator and the synthesizer see the NICs the transports use.
// `bundled`: one NIC with the summed speed, as the socket transport presents them when it stripes every
// connection over all of them (TOPOCCL_NET_NICS=all).
// `perRankCpus`: one CPU vertex per local rank ("cpu<l>"), each wired to the NICs nearest that rank (and the CPUs
// to each other), so paths from rank l leave through its own NIC (TOPOCCL_NET_NICS=near).
Topology hostTopology(const ClusterHost& host, bool bundled = false, bool perRankCpus = false);
// Half the largest fitted alpha of the file (a route crosses two network links), 0 when none was fitted.
double networkLinkLatencyUs(const ClusterFile& file);

}  // namespace topoccl::topo

// Multi-host topologies: N single-host graphs joined by a network of NetSwitch vertices.
//  - buildCluster: N copies of one node (what-if studies, presets × N).
//  - fuseHosts: what every rank builds from the per-host reports it gathered; the result depends only on
//    the set of reports, so all ranks agree on the graph (same fingerprint) whatever order they arrived in.
// Host vertices are renamed "h<i>/<name>" (bus ids are kept: they are per host); the network's switches
// ("netsw0"; "rail<k>", "spine<s>") belong to no host (Vertex::host == kNoHost).
// Topology::path between devices on different hosts is NET: out through the source's NIC (a GPU's rail
// NIC), across the switches, in through the destination's NIC, with the bottleneck of the whole route.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace topoccl::topo {

// Vertex::host of the network's switches, which no host owns.
inline constexpr int kNoHost = -1;

enum class NetworkShape : uint8_t {
  SingleSwitch,   // every NIC of every host to one switch "netsw0"
  RailOptimized,  // NIC k of every host (k = its place in bus id order on its host) to switch "rail<k>"
};

struct NetworkSpec {
  NetworkShape shape = NetworkShape::RailOptimized;
  // RailOptimized only: spine switches "spine<s>", each linked to every rail switch, so traffic can
  // change rails inside the network (without them it must change rails inside a host: PXN's motivation).
  int spines = 0;
  // NIC <-> switch GB/s per direction; 0: the NIC's speedGbps / 8 (unknown speed: NCCL's 10 Gb/s).
  double nicBandwidthGBs = 0;
  // Rail <-> spine GB/s per direction; 0: non-blocking, the rail's NIC bandwidth summed and split over the spines.
  double spineBandwidthGBs = 0;
  // One-way latency of every network link; 0: defaultLatencyUs(LinkKind::Network).
  double latencyUs = 0;
};

struct ClusterSpec {
  int hosts = 2;
  NetworkSpec network{};
  std::string name{};  // empty: "<node name>-x<hosts>"
};

// N copies of `node` (a single-host topology from any loader or preset), host i holding copy i, joined by
// `spec.network`. Throws ncclInvalidArgument when hosts < 1, when the node spans several hosts or has no
// NIC (the message names the node), or when the spec is inconsistent.
Topology buildCluster(const Topology& node, const ClusterSpec& spec);

// What one rank knows about its host: a host identity (hostname, boot id, ...) and that host's graph.
struct HostReport {
  std::string host{};
  Topology topology{};
};

struct FuseOptions {
  NetworkSpec network{};
  std::string name{};  // empty: "cluster-x<hosts>"
};

// Joins the hosts of `reports` (host i = the i-th identity in sorted order, see fusedHostOrder). Several
// reports of one host (one per local rank) fold into one host: identical ones collapse, partial ones
// (each rank seeing some devices) are united by bus id, and GPU indices that then collide are reassigned
// in bus id order. Throws ncclInvalidArgument for no reports, an empty identity or a host without a NIC.
Topology fuseHosts(const std::vector<HostReport>& reports, const FuseOptions& options);
// The identities in host index order (sorted, duplicates removed): a rank finds its own host index here.
std::vector<std::string> fusedHostOrder(const std::vector<HostReport>& reports);

// Compact single-line JSON {"format":"topoccl-host-report","version":1,"host":..,"topology":{writeJson}}
// for the bootstrap all-gather; parseHostReport throws ncclInvalidArgument naming what is wrong.
std::string serializeHostReport(const HostReport& report);
HostReport parseHostReport(const std::string& text);

}  // namespace topoccl::topo

// The alpha-beta cost model the simulator runs plans on: a set of directed resources (a link
// direction, a switch port, a NIC direction, a rank's send or receive port), each serving one
// message at a time, and for every ordered rank pair (src, dst) the route a message takes: the
// resources it holds and its latency. A message of s bytes on a route holds all of its resources
// at once, as a cut-through pipe, for holdUs + s * betaUsPerByte (beta = the route's slowest
// resource) and arrives latencyUs + s * betaUsPerByte after it started. holdUs is the part of the
// latency that keeps the resources busy (LogGP's overhead); the rest is in-flight delay during
// which the resources already serve the next message (hardware-pipelined links). Reductions cost gammaUsPerByte on the rank that reduces; local copies cost the rank's
// localCopyUsPerByte.
//
// Two ready-made models:
//   uniform       fully connected, each rank one send port and one receive port (single-port,
//                 full-duplex, homogeneous: the model of the textbook closed forms, e.g. ring
//                 all-gather (N-1)(alpha + (M/N) beta)).
//   fromTopology  routes follow Topology::path(); each directed physical link is a resource with
//                 beta = 1 / (bandwidthGBs * 1e3) us per byte and alpha = its latency (a profile
//                 default by link kind where the topology says 0). Hardware-pipelined classes
//                 (NVLink, PCIe, C2C, CPU interconnect, IB, RoCE: DMA engines, SM loads, RDMA NICs keep
//                 many messages in flight) do not hold their latency; host-driven TCP and the local
//                 copy engine's launch do. The uniform model holds all of it (the textbook model). GPU<->NvSwitch links are the
//                 switch's per-GPU ingress and egress ports; a NIC adds one resource per direction
//                 shared by every GPU using it; a PCIe uplink shared by two GPUs is one link
//                 resource. Ranks sharing a device exchange data by a local copy at memory speed.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace topoccl::algo {

struct CostResource {
  std::string name;            // "rank0.send", "gpu0->gpu1 NVLink2 x2", "nic0.tx", ...
  double alphaUs = 0;          // latency this resource adds to a route through it
  double betaUsPerByte = 0;    // time per byte while a message holds it
  bool holdsLatency = true;    // its alpha keeps the route's resources busy (false: pipelined)
};

struct CostRoute {
  std::vector<int> resources;  // indices into CostModel::resources(), in path order
  double latencyUs = 0;        // alpha of the whole route: start to arrival is latencyUs + s * beta
  double holdUs = 0;           // the part of latencyUs the resources are held for (<= latencyUs)
  double betaUsPerByte = 0;    // the slowest resource's beta
};

// Link classes of the default-latency profile (used where a topology link has latency 0).
enum class LinkClass : uint8_t { NvLink1, NvLink2, NvLink3, NvLink4, NvLink5, Pcie, CpuInterconnect, C2C,
                                 InfiniBand, RoCE, Tcp, Local };
struct LinkProfile {
  LinkClass cls;
  const char* name;
  double alphaUs;
  bool pipelined;  // the link serves the next message while one is in flight (its alpha is not held)
};
const std::vector<LinkProfile>& linkProfiles();  // one row per LinkClass, in enum order
double defaultAlphaUs(LinkClass cls);
// NVLink by generation, PCIe, CPU interconnect, C2C; a network link by the NIC at either end:
// InfiniBand, Ethernet with GPUDirect = RoCE, otherwise TCP.
LinkClass linkClassOf(const topo::Topology& topology, const topo::Link& link);
// Device-local copy rate in GB/s (about half the memory bandwidth: a copy reads and writes).
double localCopyGBs(const topo::Vertex& device);

class CostModel {
 public:
  CostModel() = default;
  explicit CostModel(int nranks);  // no resources; every route empty (free and instant) until set

  static CostModel uniform(int nranks, double alphaUs, double betaUsPerByte, double gammaUsPerByte = 0);
  // rankDevice[r] is the vertex rank r runs on (a GPU, or any vertex path() can route from).
  // Throws Error(ncclInvalidArgument) for an unknown vertex or two devices with no path.
  static CostModel fromTopology(const topo::Topology& topology, std::vector<topo::VertexId> rankDevice);

  int nranks() const { return nranks_; }
  const std::vector<CostResource>& resources() const { return resources_; }
  const CostResource& resource(int id) const { return resources_.at(static_cast<size_t>(id)); }
  const CostRoute& route(int src, int dst) const;
  // latency + bytes * beta: the time of one message alone on the route.
  double transferUs(int src, int dst, double bytes) const;
  // hold + bytes * beta: how long that message keeps the route's resources busy.
  double occupancyUs(int src, int dst, double bytes) const;

  double gammaUsPerByte = 0;                // reduction cost on the reducing rank
  std::vector<double> localCopyUsPerByte;   // per rank: Copy steps (and Reduce steps' data motion)
  // Per rank: the host its device is on (fromTopology; empty for hand-built models, meaning one host).
  // The synthesizer's hierarchical family crosses between hosts once per chunk, rank to same-position rank.
  std::vector<int> rankHost;

  // Building custom models.
  int addResource(CostResource resource);
  // Sets the route; its beta is the maximum of its resources' betas. holdUs < 0: the whole latency is held.
  void setRoute(int src, int dst, std::vector<int> resources, double latencyUs, double holdUs = -1);

  // Resources and routes, one per line.
  std::string describe() const;

 private:
  int nranks_ = 0;
  std::vector<CostResource> resources_;
  std::vector<CostRoute> routes_;  // src * nranks + dst
};

}  // namespace topoccl::algo

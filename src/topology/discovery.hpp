// Live discovery of the machine this process runs on: hwloc for CPUs, NUMA nodes, PCIe and NICs
// (exported as hwloc XML v2 and read by the same parser as hwloc files, so there is one model and one
// parser), Linux sysfs for NIC speed and link layer, and NVML (dlopen'ed at run time, as NCCL does)
// for NVLink. loadHostTopology() is the entry point the rest of topoccl uses: it honours
// TOPOCCL_TOPO_FILE / NCCL_TOPO_FILE and TOPOCCL_TOPO_DUMP_FILE / NCCL_TOPO_DUMP_FILE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace topoccl::topo {

// What the other end of one NVLink is, as NVML reports it.
enum class NvlinkRemote : uint8_t { Gpu, NvSwitch, Other };

// One active NVLink seen from a GPU: NVML's view, before it becomes graph links.
struct NvlinkObservation {
  std::string localBusId{};   // the GPU owning the link, "0000:07:00.0" (NVML's 8-digit domains accepted)
  int link = 0;               // NVML link index on that GPU
  std::string remoteBusId{};  // PCI address of the far end
  NvlinkRemote remote = NvlinkRemote::Other;
  int sm = 0;  // compute capability x10 of the local GPU; 0 when unknown
};

// One GPU as NVML sees it (used to fill sm and model, which hwloc without its NVML plugin lacks).
struct NvmlGpu {
  std::string busId{};
  int sm = 0;
  std::string model{};
};

struct NvmlReport {
  bool available = false;  // libnvidia-ml was loaded and initialised
  std::vector<NvmlGpu> gpus;
  std::vector<NvlinkObservation> nvlinks;
};

// True when this build can probe the live machine (libhwloc was found at configure time).
bool liveDiscoveryBuilt() noexcept;

// The live machine: hwloc (CPUs, NUMA, PCIe, GPUs, NICs) + sysfs NIC facts + NVML NVLink. Name is the
// host name, source "live". Throws topoccl::Error (ncclInvalidUsage) when built without hwloc, and
// ncclSystemError when hwloc cannot load the topology.
Topology discoverLiveTopology();

// The hwloc part alone, as hwloc XML v2 text (what discoverLiveTopology parses).
std::string exportLiveHwlocXml();

// Fills NIC speedGbps and linkLayer from sysfs where they are unknown: RDMA devices from
// <sysRoot>/class/infiniband/<dev>/ports/*/{rate,link_layer}, netdevs from
// <sysRoot>/class/net/<if>/{speed (Mb/s; -1 = unknown),type}. Missing files leave fields as they are.
void enrichNicsFromSysfs(Topology& topo, const std::string& sysRoot = "/sys");

// Adds NVLink links from observations: GPU-GPU link counts are summed per pair (the larger of the two
// sides' counts when both sides were observed), links to NVSwitches go to one NvSwitch vertex per host
// (created when missing, physicalSwitches 0 = unknown), links to other known bus ids (e.g. a POWER
// CPU's NPU) go to that vertex. Bandwidth = count x nvlinkBandwidthPerLinkGBs(sm). GPUs with sm 0 take
// the observation's sm. Observations naming unknown GPUs are skipped (logged), and pairs that already
// have a link keep it.
void applyNvlinks(Topology& topo, const std::vector<NvlinkObservation>& observations);

// Applies a whole NVML report: sm and model of known GPUs, then applyNvlinks.
void applyNvml(Topology& topo, const NvmlReport& report);

// Queries NVML through dlopen("libnvidia-ml.so.1"); an absent library or driver gives
// available=false (logged at INFO), never an error.
NvmlReport probeNvml();

// "00000000:07:00.0" / "07:00.0" / "0000:07:00.0" -> "0000:07:00.0"; other text is lower-cased.
std::string canonicalPciBusId(const std::string& busId);

// The topology of this host: the TOPOCCL_TOPO_FILE / NCCL_TOPO_FILE file when set, else
// discoverLiveTopology(). When TOPOCCL_TOPO_DUMP_FILE / NCCL_TOPO_DUMP_FILE is set, the result is
// also written there as NCCL topology XML (a failed write is a warning, not an error).
Topology loadHostTopology();

// TOPOCCL_TOPO_DUMP_FILE, else NCCL_TOPO_DUMP_FILE; empty when neither is set.
std::string topologyDumpFile();

}  // namespace topoccl::topo

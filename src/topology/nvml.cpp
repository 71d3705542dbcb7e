// NVLink from NVML, loaded at run time with dlopen("libnvidia-ml.so.1") as NCCL does, so topoccl
// neither includes nor links NVML. applyNvlinks() turns observations into graph links and needs no
// GPU; probeNvml() gathers them on a machine with the NVIDIA driver.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "common/log.hpp"
#include "topology/discovery.hpp"

namespace topoccl::topo {

std::string canonicalPciBusId(const std::string& busId) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  char tail = 0;
  const int colons = static_cast<int>(std::count(busId.begin(), busId.end(), ':'));
  bool parsed = false;
  if (colons == 2)
    parsed = std::sscanf(busId.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) == 4;
  else if (colons == 1)
    parsed = std::sscanf(busId.c_str(), "%x:%x.%x%c", &bus, &device, &function, &tail) == 3;
  if (!parsed || domain > 0xffff || bus > 0xff || device > 0x1f || function > 7) return normalizeBusId(busId);
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

namespace {

std::optional<VertexId> findPci(const Topology& topo, const std::string& busId) {
  if (busId.empty()) return std::nullopt;
  return topo.findByBusId(canonicalPciBusId(busId));
}

VertexId nvswitchFor(Topology& topo, int host) {
  for (VertexId id : topo.verticesOfKind(VertexKind::NvSwitch))
    if (topo.vertex(id).host == host) return id;
  std::string name = "nvswitch" + std::to_string(host);
  if (topo.findByName(name)) name.clear();  // let addVertex generate a free one
  return topo.addVertex(Vertex{.kind = VertexKind::NvSwitch, .name = name, .host = host, .physicalSwitches = 0});
}

}  // namespace

void applyNvlinks(Topology& topo, const std::vector<NvlinkObservation>& observations) {
  // Links per (local GPU, remote vertex), counted from the local side; each NVML link index once.
  std::map<std::pair<VertexId, VertexId>, std::set<int>> seen;
  std::map<VertexId, int> smOf;
  for (const NvlinkObservation& o : observations) {
    auto local = findPci(topo, o.localBusId);
    if (!local || topo.vertex(*local).kind != VertexKind::Gpu) {
      TOPOCCL_INFO(log::kGraph, "topology: NVLink %d of %s: no such GPU in the topology, ignored", o.link, o.localBusId.c_str());
      continue;
    }
    Vertex& gpu = topo.vertex(*local);
    if (gpu.sm == 0 && o.sm > 0) gpu.sm = o.sm;
    VertexId remote = -1;
    if (o.remote == NvlinkRemote::NvSwitch) {
      remote = nvswitchFor(topo, gpu.host);
    } else if (auto found = findPci(topo, o.remoteBusId)) {
      remote = *found;
      if (o.remote == NvlinkRemote::Gpu && topo.vertex(remote).kind != VertexKind::Gpu) remote = -1;
    }
    if (remote < 0 || remote == *local) {
      TOPOCCL_INFO(log::kGraph, "topology: NVLink %d of %s goes to %s, which is not in the topology; ignored", o.link,
                   o.localBusId.c_str(), o.remoteBusId.empty() ? "an unknown device" : o.remoteBusId.c_str());
      continue;
    }
    seen[{*local, remote}].insert(o.link);
  }
  // One undirected count per pair: GPU-GPU links may be seen from both ends (equal counts) or one.
  std::map<std::pair<VertexId, VertexId>, int> counts;
  for (const auto& [pair, links] : seen) {
    auto key = std::minmax(pair.first, pair.second);
    int& count = counts[{key.first, key.second}];
    count = std::max(count, static_cast<int>(links.size()));
  }
  for (const auto& [pair, count] : counts) {
    auto [a, b] = pair;
    if (topo.linkBetween(a, b)) {
      TOPOCCL_INFO(log::kGraph, "topology: %s and %s are already linked; NVML's %d NVLink(s) not added",
                   describeVertex(topo, a).c_str(), describeVertex(topo, b).c_str(), count);
      continue;
    }
    int sm = topo.vertex(a).kind == VertexKind::Gpu ? topo.vertex(a).sm : 0;
    if (topo.vertex(b).kind == VertexKind::Gpu && (sm == 0 || (topo.vertex(b).sm && topo.vertex(b).sm < sm))) sm = topo.vertex(b).sm;
    Link l{.kind = LinkKind::NvLink, .nvlinkCount = count, .nvlinkGeneration = nvlinkGenerationForSm(sm)};
    l.bandwidthGBs = count * nvlinkBandwidthPerLinkGBs(sm);
    topo.addLink(a, b, l);
  }
}

void applyNvml(Topology& topo, const NvmlReport& report) {
  for (const NvmlGpu& g : report.gpus) {
    auto id = findPci(topo, g.busId);
    if (!id || topo.vertex(*id).kind != VertexKind::Gpu) {
      TOPOCCL_INFO(log::kGraph, "topology: NVML GPU %s is not in the hwloc topology; ignored", g.busId.c_str());
      continue;
    }
    Vertex& v = topo.vertex(*id);
    if (g.sm > 0) v.sm = g.sm;
    if (v.gpuModel.empty()) v.gpuModel = g.model;
  }
  applyNvlinks(topo, report.nvlinks);
}

namespace {

// The few NVML declarations needed, from nvml.h (stable ABI since r450).
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
constexpr int kNvmlFeatureEnabled = 1;
// nvmlIntNvLinkDeviceType_t
constexpr int kNvlinkDeviceGpu = 0, kNvlinkDeviceSwitch = 2;

struct NvmlApi {
  void* handle = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*errorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*getCount)(unsigned*) = nullptr;
  nvmlReturn_t (*getHandleByIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*getPciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*getNvLinkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*getNvLinkRemotePciInfo)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*getComputeCapability)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*getName)(nvmlDevice_t, char*, unsigned) = nullptr;                   // optional
  nvmlReturn_t (*getNvLinkRemoteDeviceType)(nvmlDevice_t, unsigned, int*) = nullptr;  // optional (r460+)

  template <class F>
  bool bind(F& fn, const char* symbol) {
    void* p = dlsym(handle, symbol);
    if (!p) return false;
    static_assert(sizeof(F) == sizeof(p));
    std::memcpy(&fn, &p, sizeof p);
    return true;
  }
  const char* error(nvmlReturn_t r) const { return errorString ? errorString(r) : "NVML error"; }
};

// PCI class of a remote NVLink end from sysfs ("0x068000"); 0 when it is not a visible PCI device.
unsigned sysfsPciClass(const std::string& busId) {
  std::FILE* f = std::fopen(("/sys/bus/pci/devices/" + busId + "/class").c_str(), "r");
  if (!f) return 0;
  unsigned cls = 0;
  if (std::fscanf(f, "%x", &cls) != 1) cls = 0;
  std::fclose(f);
  return cls;
}

std::string busIdOf(const nvmlPciInfo_t& info) {
  char raw[sizeof info.busId + 1] = {};
  std::memcpy(raw, info.busId, sizeof info.busId);
  return canonicalPciBusId(raw);
}

}  // namespace

NvmlReport probeNvml() {
  NvmlReport report;
  NvmlApi api;
  api.handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api.handle) {
    TOPOCCL_INFO(log::kGraph | log::kInit, "topology: libnvidia-ml.so.1 not found (%s); no NVLink information", dlerror());
    return report;
  }
  struct Closer {
    void* h;
    ~Closer() { dlclose(h); }
  } closer{api.handle};
  bool ok = api.bind(api.init, "nvmlInit_v2") && api.bind(api.shutdown, "nvmlShutdown") &&
            api.bind(api.getCount, "nvmlDeviceGetCount_v2") && api.bind(api.getHandleByIndex, "nvmlDeviceGetHandleByIndex_v2") &&
            api.bind(api.getPciInfo, "nvmlDeviceGetPciInfo_v3") && api.bind(api.getNvLinkState, "nvmlDeviceGetNvLinkState") &&
            api.bind(api.getNvLinkRemotePciInfo, "nvmlDeviceGetNvLinkRemotePciInfo_v2") &&
            api.bind(api.getComputeCapability, "nvmlDeviceGetCudaComputeCapability");
  api.bind(api.errorString, "nvmlErrorString");
  api.bind(api.getName, "nvmlDeviceGetName");
  api.bind(api.getNvLinkRemoteDeviceType, "nvmlDeviceGetNvLinkRemoteDeviceType");
  if (!ok) {
    TOPOCCL_WARN("topology: libnvidia-ml.so.1 lacks a needed symbol (driver too old?); no NVLink information");
    return report;
  }
  if (nvmlReturn_t r = api.init(); r != kNvmlSuccess) {
    TOPOCCL_INFO(log::kGraph | log::kInit, "topology: nvmlInit failed (%s); no NVLink information", api.error(r));
    return report;
  }
  report.available = true;
  unsigned count = 0;
  if (nvmlReturn_t r = api.getCount(&count); r != kNvmlSuccess) {
    TOPOCCL_WARN("topology: nvmlDeviceGetCount failed (%s)", api.error(r));
    count = 0;
  }
  std::vector<nvmlDevice_t> devices;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    nvmlPciInfo_t pci{};
    if (api.getHandleByIndex(i, &device) != kNvmlSuccess || api.getPciInfo(device, &pci) != kNvmlSuccess) continue;
    NvmlGpu gpu{.busId = busIdOf(pci)};
    int major = 0, minor = 0;
    if (api.getComputeCapability(device, &major, &minor) == kNvmlSuccess) gpu.sm = major * 10 + minor;
    char name[96] = {};
    if (api.getName && api.getName(device, name, sizeof name) == kNvmlSuccess) gpu.model = name;
    report.gpus.push_back(gpu);
    devices.push_back(device);
  }
  std::set<std::string> gpuBusIds;
  for (const NvmlGpu& g : report.gpus) gpuBusIds.insert(g.busId);
  for (size_t i = 0; i < devices.size(); ++i) {
    const NvmlGpu& gpu = report.gpus[i];
    for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
      int state = 0;
      if (api.getNvLinkState(devices[i], link, &state) != kNvmlSuccess || state != kNvmlFeatureEnabled) continue;
      nvmlPciInfo_t remote{};
      if (api.getNvLinkRemotePciInfo(devices[i], link, &remote) != kNvmlSuccess) continue;
      NvlinkObservation o{.localBusId = gpu.busId, .link = static_cast<int>(link), .remoteBusId = busIdOf(remote), .sm = gpu.sm};
      int type = -1;
      if (gpuBusIds.count(o.remoteBusId)) o.remote = NvlinkRemote::Gpu;
      else if (api.getNvLinkRemoteDeviceType && api.getNvLinkRemoteDeviceType(devices[i], link, &type) == kNvmlSuccess)
        o.remote = type == kNvlinkDeviceSwitch ? NvlinkRemote::NvSwitch : type == kNvlinkDeviceGpu ? NvlinkRemote::Gpu : NvlinkRemote::Other;
      else {
        // NCCL's rule: an NVSwitch (class 0x0680), or a remote it cannot find in sysfs, is the NVSwitch fabric.
        unsigned cls = sysfsPciClass(o.remoteBusId);
        o.remote = cls == 0 || (cls >> 8) == 0x0680 ? NvlinkRemote::NvSwitch : (cls >> 16) == 0x03 ? NvlinkRemote::Gpu : NvlinkRemote::Other;
      }
      report.nvlinks.push_back(o);
    }
  }
  api.shutdown();
  TOPOCCL_INFO(log::kGraph | log::kInit, "topology: NVML: %zu GPU(s), %zu active NVLink(s)", report.gpus.size(), report.nvlinks.size());
  return report;
}

}  // namespace topoccl::topo
